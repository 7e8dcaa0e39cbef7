"""gRPC channels to NameServers and brokers, shared by every call of one client.

One channel per address, created lazily on the running event loop. Reconnect backoff is kept short
(gRPC's default first backoff is 1 s): after a failover the old master's address may come back at once, and
a client must not sit out a second before it tries again.
"""

from __future__ import annotations

import asyncio

import grpc

from rocketraft import __version__
from rocketraft.protocol import auth_acl, auth_internal, tls
from rocketraft.protocol.errors import (
    BrokerUnreachableError,
    ForbiddenError,
    OutcomeUnknownError,
    RocketraftError,
    UnauthorizedError,
    from_status,
)
from rocketraft.protocol.names import NAMESPACE_HEADER
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, cpb_grpc, ipb_grpc, pb, svc, svc_grpc

SEND_MESSAGE_METHOD = "/apache.rocketmq.v2.MessagingService/SendMessage"
_MESSAGES_FIELD_TAG = b"\x0a"  # SendMessageRequest.messages: field 1, length-delimited

CHANNEL_OPTIONS = (
    *GRPC_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),  # retries are the client's decision (and must keep the message id)
)

# Connection failures that a TLS mismatch also causes: a plaintext client on a TLS-only port ("Socket closed"), a
# client that does not trust the server's CA, or a server that requires a client certificate.
_TLS_MARKERS = ("socket closed", "handshake", "ssl", "certificate", "connection reset")
TLS_HINT = ("; if the server enforces TLS, connect over TLS (ClientConfig(tls=True, tls_ca_file=...); the commands' "
            "--tls --ca-file), trusting the CA that signed its certificate (and, with tlsClientAuth require, present a "
            "client certificate); a server that holds connectionsMax connections also closes one more at once")

# gRPC failures after which the request certainly never reached a server.
_NOT_SENT_MARKERS = ("failed to connect", "connection refused", "name resolution", "dns resolution",
                     "no route to host", "connect failed")


class Transport:
    def __init__(self, client_id: str, cluster_secret: str = "", sign_every_call: bool = False,
                 access_key: str = "", secret_key: str = "", client_tls: tls.ClientTls = tls.PLAINTEXT,
                 namespace: str = ""):
        self.client_id = client_id
        self._tls = client_tls
        signers = [auth_internal.cluster_signer(cluster_secret, sign_every_call)] if cluster_secret else []
        if access_key:  # every call: admin calls too, which an ACL 2.0 user may make if its ACL allows
            signers.append(lambda _call: auth_acl.client_metadata(access_key, secret_key))
        if namespace:  # every v2 call, as the official SDKs send it: the servers read its names in this namespace
            header = ((NAMESPACE_HEADER, namespace),)  # (internal calls, the admin's, name topics by stored names)
            signers.append(lambda call: () if auth_internal.is_internal(call.method) else header)
        self._signers = signers
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._raw_send: dict[str, object] = {}
        self._stubs: dict[tuple[str, type], object] = {}  # a stub builds one callable per RPC: once per address
        self.metadata = (
            ("x-mq-client-id", client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", f"rocketraft-{__version__}"),
        )

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            interceptors = auth_internal.signing_interceptors(self._signers, audience=address)
            channel = self._channels[address] = self._tls.aio_channel(address, CHANNEL_OPTIONS, interceptors)
        return channel

    def _stub(self, address: str, stub_cls):
        stub = self._stubs.get((address, stub_cls))
        if stub is None:
            stub = self._stubs[(address, stub_cls)] = stub_cls(self.channel(address))
        return stub

    def messaging(self, address: str) -> svc_grpc.MessagingServiceStub:
        return self._stub(address, svc_grpc.MessagingServiceStub)

    def fast_consume(self, address: str) -> cpb_grpc.FastConsumeStub:
        """rocketraft's batched read (PullBatch); a broker without it answers UNIMPLEMENTED."""
        return self._stub(address, cpb_grpc.FastConsumeStub)

    def send_message_raw(self, address: str):
        """SendMessage taking an already serialized SendMessageRequest (see encode_send_request)."""
        call = self._raw_send.get(address)
        if call is None:
            call = self._raw_send[address] = self.channel(address).unary_unary(
                SEND_MESSAGE_METHOD, request_serializer=None, response_deserializer=svc.SendMessageResponse.FromString)
        return call

    def broker_admin(self, address: str) -> ipb_grpc.BrokerAdminStub:
        return self._stub(address, ipb_grpc.BrokerAdminStub)

    def namesrv(self, address: str) -> ipb_grpc.NameServerStub:
        return self._stub(address, ipb_grpc.NameServerStub)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        self._raw_send.clear()
        self._stubs.clear()
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_send_request(messages: list[bytes]) -> bytes:
    """A SendMessageRequest from serialized Messages, without parsing or copying them into protobuf objects
    again: a repeated message field on the wire is just its entries, each tag + length + bytes. Equal to
    SendMessageRequest(messages=[...]).SerializeToString() (pinned by tests/client/test_wire_encoding.py)."""
    return b"".join(b"".join((_MESSAGES_FIELD_TAG, _varint(len(m)), m)) for m in messages)


async def read_pull_stream(stream) -> tuple[list[pb.Message], int | None, pb.Status | None]:
    """One PullMessage answer, as RocketMQ 5's proxy streams it: (its messages, its next_offset or None, the
    ILLEGAL_OFFSET status when retention deleted the messages from the offset asked). Any other refusal raises."""
    messages, next_offset, moved = [], None, None
    async for response in stream:
        kind = response.WhichOneof("content")
        if kind == "status":
            if response.status.code == Code.ILLEGAL_OFFSET:
                moved = response.status  # next_offset follows: where the queue starts now
            elif response.status.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
                raise from_status(response.status)
        elif kind == "message":
            messages.append(response.message)
        elif kind == "next_offset":
            next_offset = response.next_offset
    return messages, next_offset, moved


def rpc_error(exc: grpc.aio.AioRpcError, address: str, what: str) -> RocketraftError:
    """A failed RPC as a typed error that says whether the request may have been delivered."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and any(m in details.lower() for m in _NOT_SENT_MARKERS):
        hint = TLS_HINT if any(m in details.lower() for m in _TLS_MARKERS) else ""
        return BrokerUnreachableError(f"{what}: cannot reach {address} ({details}){hint}", address, sent=False)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return OutcomeUnknownError(f"{what}: {address} did not answer ({code.name}: {details}); "
                                   "the request may or may not have been carried out")
    if code == grpc.StatusCode.UNAUTHENTICATED:  # the cluster secret is missing or wrong: the details say which key
        return UnauthorizedError(f"{what}: {address} refused the call ({code.name}: {details})")
    if code == grpc.StatusCode.PERMISSION_DENIED:  # an ACL 2.0 user whose ACL does not allow this admin call
        return ForbiddenError(f"{what}: {address} refused the call ({code.name}: {details})")
    return RocketraftError(f"{what}: {address} refused the call ({code.name}: {details})")
