"""A Remoting connection carries requests of whoever signs them, several in flight at once: each request's checks
see its own signer. Once the guard kept the latest signer on the connection, so a handler that checked after an
await could decide a stranger's request by a SUPER user's rights signed on the same connection in between."""

from __future__ import annotations

import asyncio

import pytest

from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol.auth_acl import AuthorizationError, Policy
from rocketraft.remoting.codes import Request
from rocketraft.remoting.frame import Command
from serverkit.auth_guard import GuardConfig
from serverkit.remoting_acl import RemotingGuard, sign, topic_sub

USERS = {"root": apb.User(username="root", password="root-key", type=apb.SUPER, status=apb.ENABLE),
         "stranger": apb.User(username="stranger", password="stranger-key", type=apb.NORMAL, status=apb.ENABLE)}


class Conn:
    peer, peer_host = "127.0.0.1:5555", "127.0.0.1"


def signed(code: int, user: str, **ext: str) -> Command:
    return Command(code, opaque=1, ext=sign(ext, b"", user, USERS[user].password))


def test_a_check_after_an_await_sees_its_own_requests_signer_not_the_latest_on_the_connection():
    async def lookup(name: str, _ip: str):
        return USERS.get(name), Policy(None)

    guard = RemotingGuard(GuardConfig(authentication=True, authorization=True), lookup)
    conn = Conn()
    root_signed = asyncio.Event()

    async def strangers_view() -> None:  # VIEW_MESSAGE_BY_ID checks the message's topic after reading it
        await guard(conn, signed(Request.VIEW_MESSAGE_BY_ID, "stranger", topic="payroll", offset="0"))
        await root_signed.wait()  # the handler's await: another request of the connection is authorized meanwhile
        guard.require(conn, [topic_sub("payroll")])

    async def roots_call() -> None:
        await guard(conn, signed(Request.GET_MAX_OFFSET, "root", topic="payroll", queueId="0"))
        guard.require(conn, [topic_sub("payroll")])  # root may
        root_signed.set()

    async def both():
        return await asyncio.gather(asyncio.create_task(strangers_view()), asyncio.create_task(roots_call()),
                                    return_exceptions=True)

    stranger, root = asyncio.run(both())
    assert root is None
    assert isinstance(stranger, AuthorizationError) and "stranger" in stranger.message, stranger


def test_a_check_with_no_signed_request_in_its_task_is_refused():
    async def lookup(name: str, _ip: str):
        return USERS.get(name), Policy(None)

    guard = RemotingGuard(GuardConfig(authentication=True, authorization=True), lookup)
    with pytest.raises(AuthorizationError, match="without a signer"):
        guard.require(Conn(), [topic_sub("payroll")])
