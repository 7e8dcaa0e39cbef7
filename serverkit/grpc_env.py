"""The environment grpc must see before it is first imported (every server entry point calls this first)."""

import os


def quiet_grpc_logs() -> None:
    """grpc core writes one line per failed TLS handshake (INFO): anyone could flood the log. Only its errors, unless
    the operator sets GRPC_VERBOSITY (docs/security.md, "TLS"). grpc reads it once, when it is first imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
