"""rocketraft.auth.v1.BrokerAuth on a broker replica: users and ACLs checked at the door, then committed through
the group's Raft log (broker/auth_store.py applies them), and the lookup the broker's ACL guard uses.

Every call here needs the cluster secret's proof (the server's interceptor refuses it otherwise). On a broker
without a secret nobody is authenticated, so a user made or changed there is stored `unconfirmed`: refused at
authentication until an admin holding the secret confirms it (ConfirmUser) or deletes it, so users an outsider made
before the cluster was hardened do not survive the hardening. Answers of GetUser and ListUsers leave passwords out;
GetSubject, which a NameServer uses to check a client's signature, carries it.
"""

from __future__ import annotations

from collections.abc import Awaitable

from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import auth_pb2_grpc as apb_grpc
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol import auth_acl
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.wire import Code

from .auth_store import AuthView, Kind
from .core import Broker
from .errors import status_of

LIST_MAX = 10_000  # users or ACLs one List call answers at most


class BrokerAuthService(apb_grpc.BrokerAuthServicer):
    def __init__(self, broker: Broker, view: AuthView, authenticated: bool):
        """`authenticated`: this broker has a cluster secret, so every call that reaches here was proven."""
        self.broker = broker
        self.view = view
        self.authenticated = authenticated

    async def lookup(self, username: str, caller_ip: str = "") -> tuple[apb.User | None, auth_acl.Policy]:
        """The user and its ACL as this replica has applied them (the broker's ACL guard; local, so no caller is
        bounded)."""
        return self.view.user(username), self.view.policy(auth_acl.SUBJECT_PREFIX + username)

    async def _commit(self, change: spb.AuthCommand) -> None:
        await self.broker.commit(spb.Command(auth=change))

    def _stored(self, user: apb.User, creating: bool) -> bytes:
        out = auth_acl.check_user(user, creating)
        out.unconfirmed = not self.authenticated
        return out.SerializeToString()

    async def CreateUser(self, request, context):
        return await _change(lambda: self._commit(spb.AuthCommand(
            kind=Kind.CREATE_USER, user=self._stored(request.user, creating=True))))

    async def UpdateUser(self, request, context):
        return await _change(lambda: self._commit(spb.AuthCommand(
            kind=Kind.UPDATE_USER, user=self._stored(request.user, creating=False))))

    async def ConfirmUser(self, request, context):
        def confirm():
            auth_acl.check_username(request.name)
            if not self.authenticated:
                raise BadRequestError(f"confirmUser {request.name}: this broker has no cluster secret, so nobody's "
                                      f"confirmation is authenticated; set the secret on every server first "
                                      f"(docs/security.md)")
            return self._commit(spb.AuthCommand(kind=Kind.CONFIRM_USER, name=request.name))

        return await _change(confirm)

    async def DeleteUser(self, request, context):
        def delete():
            auth_acl.check_username(request.name)
            return self._commit(spb.AuthCommand(kind=Kind.DELETE_USER, name=request.name))

        return await _change(delete)

    async def GetUser(self, request, context):
        user = self.view.user(request.name)
        if user is None:
            return apb.GetUserResponse(code=Code.NOT_FOUND, message=f"user {request.name[:64]!r} does not exist")
        return apb.GetUserResponse(code=Code.OK, message="OK", user=_without_password(user))

    async def ListUsers(self, request, context):
        users = [u for u in self.view.users() if request.filter in u.username]
        return apb.ListUsersResponse(code=Code.OK, message=_counted(len(users), "users"),
                                     users=[_without_password(u) for u in users[:LIST_MAX]])

    async def CreateAcl(self, request, context):
        return await _change(lambda: self._commit(spb.AuthCommand(
            kind=Kind.CREATE_ACL, acl=auth_acl.check_acl(request.acl).SerializeToString())))

    async def UpdateAcl(self, request, context):
        return await _change(lambda: self._commit(spb.AuthCommand(
            kind=Kind.UPDATE_ACL, acl=auth_acl.check_acl(request.acl).SerializeToString())))

    async def DeleteAcl(self, request, context):
        def delete():
            subject = auth_acl.subject_of(request.subject)
            resources = [auth_acl.parse_resource(r).key for r in request.resources]
            return self._commit(spb.AuthCommand(kind=Kind.DELETE_ACL, name=subject, resources=resources))

        return await _change(delete)

    async def GetAcl(self, request, context):
        try:
            subject = auth_acl.subject_of(request.name)
        except BadRequestError as exc:
            return apb.GetAclResponse(code=exc.code, message=exc.message)
        acl = self.view.acl(subject)
        if acl is None:
            return apb.GetAclResponse(code=Code.NOT_FOUND, message=f"{subject} has no ACL")
        return apb.GetAclResponse(code=Code.OK, message="OK", acl=acl)

    async def ListAcls(self, request, context):
        acls = [a for a in self.view.acls() if request.filter in a.subject]
        return apb.ListAclsResponse(code=Code.OK, message=_counted(len(acls), "ACLs"), acls=acls[:LIST_MAX])

    async def GetSubject(self, request, context):
        user, acl = self.view.user(request.name), self.view.acl(auth_acl.SUBJECT_PREFIX + request.name)
        return apb.GetSubjectResponse(code=Code.OK, message="OK", user=user, acl=acl)


def _counted(found: int, what: str) -> str:
    if found <= LIST_MAX:
        return f"{found} {what}"
    return f"the first {LIST_MAX} of {found} {what} (LIST_MAX); give a filter to see the others"


def _without_password(user: apb.User) -> apb.User:
    return apb.User(username=user.username, type=user.type, status=user.status, unconfirmed=user.unconfirmed)


async def _change(operation) -> apb.AuthChangeResponse:
    """Run a change (the door's checks, then the commit); any failure becomes a code and a message."""
    try:
        pending: Awaitable[None] = operation()
        await pending
    except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
        status = status_of(exc)
        return apb.AuthChangeResponse(code=status.code, message=status.message)
    return apb.AuthChangeResponse(code=Code.OK, message="OK")
