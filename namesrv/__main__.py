"""`python -m namesrv --listenPort 9876` (or `-c namesrv.toml`): run one NameServer until SIGTERM/SIGINT."""

import os

# grpc core writes one line per failed TLS handshake (INFO): anyone could flood the log. Only its errors, unless
# the operator sets GRPC_VERBOSITY; set before grpc is imported (docs/security.md, "TLS")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import sys  # noqa: E402

from namesrv.server import main  # noqa: E402

sys.exit(main())
