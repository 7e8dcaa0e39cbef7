"""One fuzzed request on the wire (raw bytes, so nothing on the client side re-validates it) and its verdict.

A verdict is "ok" (success), "refused" (an error that names itself: a v2 or internal code other than an
internal error, with a message; or a gRPC status with details) or "defect": an internal error, a refusal with
no message, a call that outlived its deadline (a hang), an UNKNOWN / INTERNAL gRPC status (a traceback in the
server), UNAVAILABLE (the server went away), or a response that is not a valid message of its type.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol import limits
from rocketraft.protocol.wire import Code
from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request, Response

from . import frames

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
    answered: bool = True  # an "ok" that carried an answer (not a stream that said nothing, not a oneway request)
    succeeded: frozenset[int] = frozenset()  # Remoting: the opaques of the requests answered SUCCESS


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
            return _worst([judge_bytes(r, response_cls) for r in responses])
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


def _worst(verdicts: list[Verdict]) -> Verdict:
    """The worst verdict; an "ok" without any answer (a stream that sent nothing) is not `answered`."""
    worst = OK if verdicts else Verdict("ok", "OK", answered=False)
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


# -- the Remoting doors (RocketMQ 4.x clients) ------------------------------------------------------------------------
# Bytes written to a Remoting port are read as the server reads them (rocketraft.remoting.frame, the code under test,
# is what tells a malformed frame here too): every complete well-formed request must be answered, on the same
# connection, with its opaque, in its serialize type, with a response code and, unless SUCCESS, a remark; a oneway
# request or a frame flagged as a response gets no answer, and the connection still serves (a probe is answered); a
# malformed frame closes its connection (with one WARNING line in the server's log, counted by run.py).
REMOTING_PULL_DEADLINE_S = STREAM_DEADLINE_S  # a pull may be suspended up to LONG_POLLING_MS_MAX
REMOTING_IDLE_REUSE_S = 60.0  # a kept connection idle this long is opened again (the server closes at 120 s)
PROBE_CODE = 32_767  # served by nobody: the probe after a frame that gets no answer
PROBE_OPAQUE = 7_777_777
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Plan:
    """What the server must do with the bytes of one fuzzed request."""
    answers: list[tuple[int, int]]  # (opaque, serialize type) of each request that must be answered
    closes: bool = False  # the server must close the connection (a malformed frame, or the bytes end inside one)
    warns: bool = False  # ... with a WARNING line naming the problem
    problem: str = ""  # what the decoder found
    deadline_s: float = UNARY_DEADLINE_S
    unexpected: str = ""  # the decoder raised something other than a FrameError (the server's loop does not catch it)
    requests: list = field(default_factory=list)  # the requests the server reads (frame.Command), answered or not


TLS_HANDSHAKE_FIRST_BYTE = 0x16  # a permissive port reads a connection that starts with it as TLS (server.py)


def plan_of(data: bytes, tls_permissive: bool = False) -> Plan:
    """What the server must do with these bytes, written first on a connection when they must close it;
    `tls_permissive`: the port takes a connection whose first byte is a TLS handshake's for TLS, and closes it when
    the handshake fails, with an INFO line and not a frame's WARNING."""
    plan = Plan(answers=[])
    at = 0
    if not data:
        plan.closes = True  # we end the connection at a frame boundary: closed without a word
        return plan
    if tls_permissive and data[0] == TLS_HANDSHAKE_FIRST_BYTE:
        plan.closes, plan.problem = True, "the first byte is a TLS handshake's: read as TLS (tlsMode permissive)"
        return plan
    while at < len(data):
        if len(data) - at < 4:
            return _malformed(plan, "the connection ends inside a frame's length")
        (length,) = frame.LENGTH.unpack_from(data, at)
        try:
            frame.check_length(length)
        except frame.FrameError as exc:
            return _malformed(plan, str(exc))
        if at + 4 + length > len(data):
            return _malformed(plan, "the connection ends inside a frame")
        try:
            command = frame.decode(data[at + 4:at + 4 + length])
        except frame.FrameError as exc:
            return _malformed(plan, str(exc))
        except Exception as exc:  # noqa: BLE001 - the finding: the server's decoder raises it too
            plan = _malformed(plan, f"{type(exc).__name__}: {str(exc)[:100]}")
            plan.unexpected = type(exc).__name__
            return plan
        if not command.is_response:
            plan.requests.append(command)
        if not command.is_response and not command.is_oneway:
            plan.answers.append((command.opaque, command.serialize))
            if command.code == Request.PULL_MESSAGE:
                plan.deadline_s = REMOTING_PULL_DEADLINE_S
        at += 4 + length
    return plan


@dataclass(frozen=True)
class KnownFinding:
    name: str
    reason: str  # what the server does wrong, where, and since when it is known
    matches: Callable[[bytes, Plan], bool]


# Findings reported and not fixed yet: a request that matches one is not sent (unless `--send-known`, to check a fix)
# and is counted under the finding's name in the report, so the suite stays green and the gap stays in sight. Remove
# an entry once its fix is in: the fuzzer then sends those requests again.
KNOWN_FINDINGS: tuple[KnownFinding, ...] = ()  # json-header-recursion (2026-11-27) is fixed: frame.py refuses it


def known_finding(data: bytes, plan: Plan) -> str:
    """The name of the known finding this request would trigger, or ""."""
    return next((known.name for known in KNOWN_FINDINGS if known.matches(data, plan)), "")


def _malformed(plan: Plan, problem: str) -> Plan:
    plan.closes, plan.warns, plan.problem = True, True, problem
    return plan


class RemotingConnections:
    """One kept connection per thread and address (as a 4.x client keeps one per broker), opened again when it was
    idle long or ended; a request that must close its connection gets one of its own."""

    def __init__(self):
        self._local = threading.local()

    def get(self, address: str) -> tuple[socket.socket, bool]:
        kept = getattr(self._local, "kept", None)
        if kept is None:
            kept = self._local.kept = {}
        sock, last = kept.get(address, (None, 0.0))
        if sock is not None and time.monotonic() - last < REMOTING_IDLE_REUSE_S:
            return sock, True
        if sock is not None:
            sock.close()
        sock = open_socket(address)
        kept[address] = (sock, time.monotonic())
        return sock, False

    def used(self, address: str, sock: socket.socket) -> None:
        self._local.kept[address] = (sock, time.monotonic())

    def drop(self, address: str) -> None:
        sock, _ = self._local.kept.pop(address, (None, 0.0))
        if sock is not None:
            sock.close()

    def close_all(self) -> None:
        pass  # each thread's sockets close with the thread (the pool's threads end with the run)


def open_socket(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def call_remoting(connections: RemotingConnections, address: str, data: bytes, plan: Plan) -> Verdict:
    if plan.closes:
        return _must_close(address, data, plan)
    for attempt in (0, 1):
        sock, reused = connections.get(address)
        try:
            verdict = _answered(sock, data, plan)
        except _Ended as ended:
            connections.drop(address)
            if reused and attempt == 0 and ended.before_sending:
                continue  # a kept connection the server had ended: once more on a new one
            return Verdict("defect", f"the connection was closed without an answer ({ended})")
        except TimeoutError:
            connections.drop(address)
            return Verdict("defect", f"no answer within {plan.deadline_s:.0f} s (a hang)")
        if verdict.kind == "defect":
            connections.drop(address)  # what it left unread would be taken for the next request's answers
        else:
            connections.used(address, sock)
        return verdict
    raise AssertionError("unreachable")


class _Ended(Exception):
    def __init__(self, what: str, before_sending: bool = False):
        super().__init__(what)
        self.before_sending = before_sending


def _answered(sock: socket.socket, data: bytes, plan: Plan) -> Verdict:
    try:
        sock.sendall(data)
    except OSError as exc:
        raise _Ended(f"write failed: {exc}", before_sending=True) from None
    waiting = collections.Counter(opaque for opaque, _ in plan.answers)
    serializes: dict[int, set[int]] = collections.defaultdict(set)
    for opaque, serialize in plan.answers:
        serializes[opaque].add(serialize)
    probe = None
    if not waiting:  # a oneway request or a "response": nothing comes back; the connection must still serve
        probe = PROBE_OPAQUE
        sock.sendall(frames.request(PROBE_CODE, {}, b"", frames.SERIALIZE_JSON, probe))
        waiting[probe] = 1
    deadline = time.monotonic() + plan.deadline_s
    reader = FrameReader(sock)
    verdicts = []
    succeeded = set()
    while waiting:
        command = reader.next(deadline)
        if not command.is_response:
            if command.code not in (Request.NOTIFY_CONSUMER_IDS_CHANGED, Request.CHECK_TRANSACTION_STATE):
                return Verdict("defect", f"the server sent a request of code {command.code}")
            continue
        if waiting[command.opaque] <= 0:
            return Verdict("defect", f"an answer with opaque {command.opaque}, which no request in flight had")
        waiting[command.opaque] -= 1
        if not waiting[command.opaque]:
            del waiting[command.opaque]
        if command.opaque == probe:
            if command.code != 3:  # REQUEST_CODE_NOT_SUPPORTED
                return Verdict("defect", f"the probe after a frame without answer got code {command.code}")
            verdicts.append(Verdict("ok", "no answer (oneway or response flag)"))
            continue
        if command.serialize not in serializes[command.opaque]:
            verdicts.append(Verdict("defect", f"answered in serialize type {command.serialize} to a request in "
                                              f"{sorted(serializes[command.opaque])}"))
        verdicts.append(judge_command(command))
        if command.code == Response.SUCCESS:
            succeeded.add(command.opaque)
    worst = _worst(verdicts)
    return Verdict(worst.kind, worst.detail, answered=bool(succeeded), succeeded=frozenset(succeeded)) \
        if worst.kind == "ok" else worst


class FrameReader:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def _exactly(self, n: int, deadline: float) -> bytes:
        data = b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(n - len(data), 1 << 20))
            except TimeoutError:
                raise
            except OSError as exc:
                raise _Ended(f"read failed: {exc}") from None
            if not chunk:
                raise _Ended(f"the server ended the connection after {len(data)} of {n} bytes")
            data += chunk
        return data

    def next(self, deadline: float):
        (length,) = frame.LENGTH.unpack(self._exactly(4, deadline))
        try:
            return frame.decode(self._exactly(length, deadline))
        except frame.FrameError as exc:
            raise _Ended(f"the server's answer is not a frame: {exc}") from None


def _must_close(address: str, data: bytes, plan: Plan) -> Verdict:
    """Writes the bytes on a connection of their own, ends its writing side, and reads until the server closes it."""
    try:
        sock = open_socket(address)
    except OSError as exc:
        return Verdict("defect", f"cannot connect: {exc}")
    try:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (it read a bad length and did not wait for the rest)
        deadline = time.monotonic() + plan.deadline_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return Verdict("defect", f"the connection was not closed after a malformed frame ({plan.problem}) "
                                         f"within {plan.deadline_s:.0f} s")
            sock.settimeout(left)
            try:
                if not sock.recv(1 << 16):
                    break
            except TimeoutError:
                continue
            except OSError:
                break  # reset: closed
    finally:
        sock.close()
    if plan.unexpected:
        return Verdict("defect", f"the frame decoder raised {plan.unexpected} (not a FrameError)")
    if plan.warns:
        return Verdict("refused", "CLOSED (malformed frame)")
    return Verdict("refused", "CLOSED (not TLS)" if plan.problem else "CLOSED (no frame)")


def judge_command(command) -> Verdict:
    code = command.code
    name = Response(code).name if code in Response._value2member_map_ else str(code)
    if code == Response.SUCCESS:
        return OK
    if code == Response.SYSTEM_ERROR and command.remark.startswith("internal error"):
        return Verdict("defect", f"{name}: {command.remark[:200]}")
    if not command.remark.strip():
        return Verdict("defect", f"{name} with no remark")
    return Verdict("refused", name)
