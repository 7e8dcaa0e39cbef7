"""ACL 2.0 administration (users and ACLs) on every broker group, through an Admin client's channels.

Users and ACLs are kept by each broker group (in its Raft log), so a change is made on every group the
NameServers know, like a topic; the answer names each group that refused. Reads ask the first group that answers.
The calls need the cluster secret (ClientConfig.cluster_secret, from $ROCKETRAFT_CLUSTER_SECRET).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import auth_pb2_grpc as apb_grpc
from rocketraft.protocol.errors import BadRequestError, NotFoundError, RocketraftError, error_for
from rocketraft.protocol.wire import Code

from .admin import Admin
from .transport import rpc_error

DECISIONS = {"ALLOW": apb.ALLOW, "DENY": apb.DENY}
USER_TYPES = {"NORMAL": apb.NORMAL, "SUPER": apb.SUPER}
USER_STATUSES = {"ENABLE": apb.ENABLE, "DISABLE": apb.DISABLE}


class AuthAdmin:
    def __init__(self, admin: Admin):
        self.admin = admin

    async def _groups(self) -> list[tuple[str, list[str]]]:
        """(group, replica addresses, master first) of every group the NameServers know."""
        info = await self.admin._cluster_info()
        out = []
        for g in info.groups:
            replicas = sorted(g.replicas, key=lambda r: r.replica_id != g.master_replica_id)
            out.append((g.group, [r.address for r in replicas]))
        if not out:
            raise NotFoundError("no broker group is registered with the NameServers: start the brokers first")
        return out

    async def _on_group(self, group: str, addresses: list[str], what: str, call: Callable[[object], Awaitable]):
        last: RocketraftError | None = None
        for address in addresses:
            try:
                return await call(apb_grpc.BrokerAuthStub(self.admin.transport.channel(address)))
            except grpc.aio.AioRpcError as exc:
                last = rpc_error(exc, address, f"{what} on group {group}")
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    break
        raise last or RocketraftError(f"{what}: group {group} has no replica")

    async def _change(self, what: str, call: Callable[[object], Awaitable]) -> list[str]:
        groups = await self._groups()
        replies = await asyncio.gather(*(self._on_group(g, a, what, call) for g, a in groups),
                                       return_exceptions=True)
        failed, done = [], []
        for (group, _), reply in zip(groups, replies, strict=True):
            if isinstance(reply, BaseException):
                if not isinstance(reply, RocketraftError):
                    raise reply
                failed.append((group, reply.code, reply.message))
            elif reply.code != Code.OK:
                failed.append((group, reply.code, reply.message))
            else:
                done.append(group)
        if failed:
            detail = "; ".join(f"group {g}: {m}" for g, _, m in failed)
            ok = f" (done on {', '.join(done)})" if done else ""
            raise error_for(failed[0][1], f"{what} failed: {detail}{ok}")
        return done

    async def _read(self, what: str, call: Callable[[object], Awaitable]):
        groups = await self._groups()
        last: RocketraftError | None = None
        for group, addresses in groups:
            try:
                reply = await self._on_group(group, addresses, what, call)
            except RocketraftError as exc:
                last = exc
                continue
            if reply.code != Code.OK:
                raise error_for(reply.code, f"{what}: {reply.message}")
            return reply
        raise last or RocketraftError(f"{what}: no group answered")

    def _timeout(self) -> float:
        return self.admin.config.request_timeout_s

    # -- users ---------------------------------------------------------------------------------------------------
    async def create_user(self, username: str, password: str, user_type: str = "NORMAL",
                          status: str = "ENABLE") -> list[str]:
        user = apb.User(username=username, password=password, type=_pick(USER_TYPES, user_type, "user type"),
                        status=_pick(USER_STATUSES, status, "user status"))
        return await self._change(f"create user {username}", lambda s: s.CreateUser(
            apb.UserRequest(user=user), timeout=self._timeout()))

    async def update_user(self, username: str, password: str = "", user_type: str = "",
                          status: str = "") -> list[str]:
        user = apb.User(username=username, password=password,
                        type=_pick(USER_TYPES, user_type, "user type") if user_type else 0,
                        status=_pick(USER_STATUSES, status, "user status") if status else 0)
        return await self._change(f"update user {username}", lambda s: s.UpdateUser(
            apb.UserRequest(user=user), timeout=self._timeout()))

    async def delete_user(self, username: str) -> list[str]:
        return await self._change(f"delete user {username}", lambda s: s.DeleteUser(
            apb.NameRequest(name=username), timeout=self._timeout()))

    async def confirm_user(self, username: str) -> list[str]:
        """Confirm a user made or changed while its group had no cluster secret (docs/security.md)."""
        return await self._change(f"confirm user {username}", lambda s: s.ConfirmUser(
            apb.NameRequest(name=username), timeout=self._timeout()))

    async def get_user(self, username: str) -> apb.User:
        return (await self._read(f"get user {username}", lambda s: s.GetUser(
            apb.NameRequest(name=username), timeout=self._timeout()))).user

    async def list_users(self, filter_text: str = "") -> list[apb.User]:
        return list((await self._read("list users", lambda s: s.ListUsers(
            apb.ListRequest(filter=filter_text), timeout=self._timeout()))).users)

    # -- ACLs ----------------------------------------------------------------------------------------------------
    async def create_acl(self, subject: str, resources: list[str], actions: list[str], decision: str = "ALLOW",
                         source_ips: list[str] = (), update: bool = False) -> list[str]:
        verdict = _pick(DECISIONS, decision, "decision")
        acl = apb.Acl(subject=subject, entries=[apb.PolicyEntry(resource=r, actions=actions, decision=verdict,
                                                                source_ips=list(source_ips)) for r in resources])
        what = f"{'update' if update else 'create'} ACL of {subject}"
        return await self._change(what, lambda s: (s.UpdateAcl if update else s.CreateAcl)(
            apb.AclRequest(acl=acl), timeout=self._timeout()))

    async def delete_acl(self, subject: str, resources: list[str] = ()) -> list[str]:
        return await self._change(f"delete ACL of {subject}", lambda s: s.DeleteAcl(
            apb.DeleteAclRequest(subject=subject, resources=list(resources)), timeout=self._timeout()))

    async def get_acl(self, subject: str) -> apb.Acl:
        return (await self._read(f"get ACL of {subject}", lambda s: s.GetAcl(
            apb.NameRequest(name=subject), timeout=self._timeout()))).acl

    async def list_acls(self, filter_text: str = "") -> list[apb.Acl]:
        return list((await self._read("list ACLs", lambda s: s.ListAcls(
            apb.ListRequest(filter=filter_text), timeout=self._timeout()))).acls)


def _pick(choices: dict[str, int], value: str, what: str) -> int:
    try:
        return choices[value.strip().upper()]
    except KeyError:
        raise BadRequestError(f"{what} {value!r}: use {' or '.join(choices)}") from None
