"""How the broker and the NameServer put a gRPC service on a server: every request is decoded here, and one that
is not a valid protobuf message of its type gets a named error instead of a traceback.

grpcio's generated `add_..._to_server` decodes requests with `FromString`; garbage bytes then raise inside grpc,
which logs an ERROR with a full traceback per request (anyone could flood the log) and answers UNKNOWN. Here a
request that does not decode is answered without calling the servicer: a v2 response with status BAD_REQUEST, an
internal response with code BAD_REQUEST, or (for a response type with neither) the gRPC status INVALID_ARGUMENT;
each names the message type and the decoder's complaint. A bidirectional stream (Telemetry) hands its servicer an
`Undecodable` for the frame instead, so the stream goes on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol import limits
from rocketraft.protocol.tls import ENFORCING, PERMISSIVE, ServerTls
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, pb
from serverkit import tls_permissive

log = logging.getLogger(__name__)


def new_server(rpcs_in_flight_max: int = limits.RPCS_IN_FLIGHT_MAX,
               connection_idle_ms: int = limits.CONNECTION_IDLE_MS, connections_max: int = limits.CONNECTIONS_MAX,
               **kwargs) -> grpc.aio.Server:
    """A gRPC server with every server's bounds: at most rpcs_in_flight_max RPCs at once (grpc answers one more
    with RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!"), a connection with no RPC for connection_idle_ms
    closed by the server (GOAWAY; the client reconnects on its next call), at most connections_max connections at
    once (one more is closed before its handshake) and HANDSHAKE_TIMEOUT_MS for a new one to start speaking."""
    options = (*GRPC_OPTIONS, ("grpc.max_connection_idle_ms", connection_idle_ms),
               ("grpc.max_allowed_incoming_connections", connections_max),
               ("grpc.server_handshake_timeout_ms", limits.HANDSHAKE_TIMEOUT_MS))
    return grpc.aio.server(options=options, maximum_concurrent_rpcs=rpcs_in_flight_max, **kwargs)


@dataclass
class Bound:
    """A server's port as `bind` put it there; `close()` after the server stops (permissive: stops the splicer)."""
    port: int
    splicer: object | None = None

    def close(self) -> None:
        if self.splicer is not None:
            self.splicer.close()
            self.splicer = None


def bind(server: grpc.aio.Server, listen: str, tls: ServerTls) -> Bound:
    """Put `server` on `listen` as `tls` says (port 0 in the answer: it could not bind). Permissive mode binds the
    server on two loopback ports and listens on `listen` itself (tls_permissive.Splicer, started here)."""
    if tls.mode == ENFORCING:
        return Bound(server.add_secure_port(listen, tls.server_credentials()))
    if tls.mode == PERMISSIVE:
        tls_port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
        plain_port = server.add_insecure_port("127.0.0.1:0")
        if not tls_port or not plain_port:
            return Bound(0)
        splicer = tls_permissive.Splicer(listen, tls_port, plain_port)
        port = splicer.start()
        return Bound(port, splicer if port else None)
    return Bound(server.add_insecure_port(listen))


def client_peer(context) -> str:
    """The caller of an RPC as a gRPC peer string ("ipv4:10.0.0.7:51234"): the real caller also when a permissive
    TLS port spliced the connection through loopback (tls_permissive)."""
    return tls_permissive.real_peer(context.peer() or "")


@dataclass(frozen=True)
class Undecodable:
    """A request frame that is not a valid message of its type."""
    type_name: str
    problem: str

    @property
    def message(self) -> str:
        return f"the request is not a valid {self.type_name} ({self.problem}); send a protobuf-encoded " \
               f"{self.type_name}"


def _decoder(message_cls):
    def decode(data: bytes):
        try:
            return message_cls.FromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:
            log.debug("undecodable %s of %d bytes: %s", message_cls.DESCRIPTOR.name, len(data), exc)
            return Undecodable(message_cls.DESCRIPTOR.full_name, str(exc) or type(exc).__name__)

    return decode


def refusal(response_cls, undecodable: Undecodable):
    """The response that answers an undecodable request, or None if its type has no field for an error."""
    fields = response_cls.DESCRIPTOR.fields_by_name
    if "status" in fields and fields["status"].message_type is pb.Status.DESCRIPTOR:
        return response_cls(status=pb.Status(code=Code.BAD_REQUEST, message=undecodable.message))
    if "code" in fields and "message" in fields:
        return response_cls(code=Code.BAD_REQUEST, message=undecodable.message)
    return None


async def _refuse(response_cls, request: Undecodable, context):
    """The answer to an undecodable request; a response type with no field for an error aborts the call."""
    answer = refusal(response_cls, request)
    if answer is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
    return answer


def _unary(method, response_cls):
    @functools.wraps(method)
    async def handle(request, context):
        if isinstance(request, Undecodable):
            return await _refuse(response_cls, request, context)
        return await method(request, context)

    return handle


def _server_streaming(method, response_cls):
    """Writes each response itself (context.write) rather than yielding it to grpc: a response the client will not
    take (it reset the stream, or the answer is over its receive limit) then fails here, where it is one WARNING
    line, instead of in grpc, which logged an ERROR with a traceback (ExecuteBatchError) for each such call."""
    @functools.wraps(method)
    async def handle(request, context):
        if isinstance(request, Undecodable):
            await context.write(await _refuse(response_cls, request, context))
            return
        responses = method(request, context)
        try:
            async for response in responses:
                try:
                    await context.write(response)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - whatever grpc raises for a stream the client dropped
                    log.warning("%s: the client %s did not take the answer (%s: %s); the call ends with an error on "
                                "its side (a message received this way stays invisible for its invisible duration, "
                                "then comes again)", method.__name__, context.peer(), type(exc).__name__,
                                str(exc)[:200])
                    return
        finally:
            await responses.aclose()

    return handle


def _handler(servicer, method: MethodDescriptor):
    request_cls, response_cls = GetMessageClass(method.input_type), GetMessageClass(method.output_type)
    implementation = getattr(servicer, method.name)
    decode, encode = _decoder(request_cls), response_cls.SerializeToString
    if method.client_streaming and method.server_streaming:  # the servicer receives Undecodable frames itself
        return grpc.stream_stream_rpc_method_handler(implementation, decode, encode)
    if method.client_streaming:
        return grpc.stream_unary_rpc_method_handler(implementation, decode, encode)
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(_server_streaming(implementation, response_cls), decode, encode)
    return grpc.unary_unary_rpc_method_handler(_unary(implementation, response_cls), decode, encode)


def add_service(server: grpc.aio.Server, servicer, service: ServiceDescriptor) -> None:
    """Serve every method of `service` from `servicer` (an instance of its generated Servicer class)."""
    handlers = {method.name: _handler(servicer, method) for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


async def merged(responses, refusals: asyncio.Queue):
    """Everything `responses` yields and everything put on `refusals`, in the order they come, until `responses`
    ends."""
    responses = responses.__aiter__()
    next_response = asyncio.ensure_future(responses.__anext__())
    next_refusal = asyncio.ensure_future(refusals.get())
    try:
        while True:
            done, _ = await asyncio.wait({next_response, next_refusal}, return_when=asyncio.FIRST_COMPLETED)
            if next_refusal in done:
                yield next_refusal.result()
                next_refusal = asyncio.ensure_future(refusals.get())
            if next_response in done:
                try:
                    response = next_response.result()
                except StopAsyncIteration:
                    return
                yield response
                next_response = asyncio.ensure_future(responses.__anext__())
    finally:
        for task in (next_response, next_refusal):
            task.cancel()
        await asyncio.gather(next_response, next_refusal, return_exceptions=True)
        await responses.aclose()
