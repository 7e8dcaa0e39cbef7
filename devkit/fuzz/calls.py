"""One fuzzed request on the wire (raw bytes, so nothing on the client side re-validates it) and its verdict.

A verdict is "ok" (success), "refused" (an error that names itself: a v2 or internal code other than an
internal error, with a message; or a gRPC status with details) or "defect": an internal error, a refusal with
no message, a call that outlived its deadline (a hang), an UNKNOWN / INTERNAL gRPC status (a traceback in the
server), UNAVAILABLE (the server went away), or a response that is not a valid message of its type.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol import limits
from rocketraft.protocol.wire import Code

UNARY_DEADLINE_S = 15.0  # a send may wait writeRetryMillis and a forward; nothing answers later than this
STREAM_DEADLINE_S = limits.LONG_POLLING_MS_MAX / 1000 + 15.0  # a receive may long-poll up to the maximum
TELEMETRY_READ_S = 0.5  # a Telemetry stream stays open: read what comes in this long, then drop it
INTERNAL_CODES = (Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR)
GRPC_DEFECTS = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS,
                grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok", "refused", "defect"
    detail: str  # the code's name; for a defect, what went wrong


OK = Verdict("ok", "OK")


def call(channel: grpc.Channel, service: str, method: MethodDescriptor, payload: bytes,
         metadata: tuple[tuple[str, str], ...]) -> Verdict:
    path = f"/{service}/{method.name}"
    response_cls = GetMessageClass(method.output_type)
    started = time.monotonic()
    try:
        if method.client_streaming:
            return _stream_stream(channel.stream_stream(path), payload, metadata, response_cls)
        if method.server_streaming:
            responses = channel.unary_stream(path)(payload, timeout=STREAM_DEADLINE_S, metadata=metadata)
            return _worst(judge_bytes(r, response_cls) for r in responses)
        return judge_bytes(channel.unary_unary(path)(payload, timeout=UNARY_DEADLINE_S, metadata=metadata),
                           response_cls)
    except grpc.RpcError as exc:
        return judge_status(exc.code(), exc.details() or "", time.monotonic() - started)


def _stream_stream(stub, payload: bytes, metadata, response_cls) -> Verdict:
    """Opens a stream, sends the frame twice, reads for a moment, and drops it."""
    responses = stub(iter((payload, payload)), timeout=TELEMETRY_READ_S, metadata=metadata)
    verdicts = []
    try:
        for response in responses:
            verdicts.append(judge_bytes(response, response_cls))
    except grpc.RpcError as exc:
        if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            verdicts.append(judge_status(exc.code(), exc.details() or "", 0.0))
    finally:
        responses.cancel()
    return _worst(verdicts)


def _worst(verdicts) -> Verdict:
    worst = OK
    for verdict in verdicts:
        if verdict.kind == "defect":
            return verdict
        if verdict.kind == "refused":
            worst = verdict
    return worst


def judge_bytes(data: bytes, response_cls) -> Verdict:
    try:
        response = response_cls.FromString(data)
    except DecodeError as exc:
        return Verdict("defect", f"the response is not a valid {response_cls.DESCRIPTOR.name}: {exc}")
    return judge_response(response)


def judge_response(response: Message) -> Verdict:
    fields = response.DESCRIPTOR.fields_by_name
    if "status" in fields and response.HasField("status"):
        code, text = response.status.code, response.status.message
    elif "code" in fields and "message" in fields:
        code, text = response.code, response.message
    else:
        return OK
    if code in (Code.OK, Code.CODE_UNSPECIFIED) and not (code == Code.CODE_UNSPECIFIED and text):
        return OK
    name = Code.Name(code) if code in Code.values() else str(code)
    if code in INTERNAL_CODES:
        return Verdict("defect", f"{name}: {text[:200]}")
    if not text.strip():
        return Verdict("defect", f"{name} with no message")
    return Verdict("refused", name)


def judge_status(code: grpc.StatusCode, details: str, elapsed_s: float) -> Verdict:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Verdict("defect", f"no answer within {elapsed_s:.1f} s (a hang)")
    if code in GRPC_DEFECTS:
        return Verdict("defect", f"gRPC {code.name}: {details[:200]}")
    if not details.strip():
        return Verdict("defect", f"gRPC {code.name} with no details")
    return Verdict("refused", f"gRPC {code.name}")
