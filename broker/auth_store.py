"""ACL 2.0 state of a broker group: users and ACLs in two tables, changed only through Raft (AuthCommand).

Apply (every replica, deterministic) decides create-versus-update races in log order and refuses by name a change
that does not fit what is stored; the door (broker/auth_service.py) has already checked each field. Reads come from
a cached view rebuilt whenever a committed entry changed the tables (the state machine's `auth_generation`).
"""

from __future__ import annotations

import threading

from google.protobuf.message import DecodeError

from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.auth_acl import ENTRIES_MAX, Policy, merge_acl
from rocketraft.protocol.wire import Code

from . import tables as t

Kind = spb.AuthCommand.Kind


def apply(command: spb.AuthCommand, db: dict, txn, error_cls):
    """Apply one change; None, or error_cls(code, message) for a change that does not fit the stored state."""
    try:
        return _apply(command, db, txn, error_cls)
    except DecodeError as exc:  # only the door writes these; refuse rather than stop every replica on one
        return error_cls(Code.BAD_REQUEST, f"auth command with an undecodable user or ACL: {exc}")


def _apply(command: spb.AuthCommand, db: dict, txn, error_cls):
    users, acls = db[t.USERS], db[t.ACLS]
    if command.kind in (Kind.CREATE_USER, Kind.UPDATE_USER):
        user = apb.User.FromString(command.user)
        raw = txn.get(user.username.encode(), db=users)
        if command.kind == Kind.CREATE_USER and raw is not None:
            return error_cls(Code.BAD_REQUEST, f"user {user.username} exists already; change it with updateUser")
        if command.kind == Kind.UPDATE_USER:
            if raw is None:
                return error_cls(Code.NOT_FOUND, f"user {user.username} does not exist; create it with createUser")
            user = _updated(apb.User.FromString(raw), user)
        txn.put(user.username.encode(), user.SerializeToString(), db=users)
        return None
    if command.kind == Kind.CONFIRM_USER:
        raw = txn.get(command.name.encode(), db=users)
        if raw is None:
            return error_cls(Code.NOT_FOUND, f"user {command.name} does not exist; nothing to confirm")
        user = apb.User.FromString(raw)
        user.unconfirmed = False
        txn.put(command.name.encode(), user.SerializeToString(), db=users)
        return None
    if command.kind == Kind.DELETE_USER:
        if not txn.delete(command.name.encode(), db=users):
            return error_cls(Code.NOT_FOUND, f"user {command.name} does not exist; nothing to delete")
        txn.delete(f"User:{command.name}".encode(), db=acls)
        return None
    if command.kind in (Kind.CREATE_ACL, Kind.UPDATE_ACL):
        return _put_acl(command, users, acls, txn, error_cls)
    if command.kind == Kind.DELETE_ACL:
        return _delete_acl(command, acls, txn, error_cls)
    return error_cls(Code.BAD_REQUEST, f"unknown auth command kind {command.kind}")


def _updated(stored: apb.User, change: apb.User) -> apb.User:
    out = apb.User()
    out.CopyFrom(stored)
    if change.password:
        out.password = change.password
    if change.type:
        out.type = change.type
    if change.status:
        out.status = change.status
    out.unconfirmed = stored.unconfirmed or change.unconfirmed  # a change nobody authenticated taints the user
    return out


def _put_acl(command: spb.AuthCommand, users, acls, txn, error_cls):
    acl = apb.Acl.FromString(command.acl)
    username = acl.subject.removeprefix("User:")
    if txn.get(username.encode(), db=users) is None:
        return error_cls(Code.NOT_FOUND, f"user {username} does not exist; create it with createUser before its ACL")
    raw = txn.get(acl.subject.encode(), db=acls)
    if command.kind == Kind.UPDATE_ACL and raw is None:
        return error_cls(Code.NOT_FOUND, f"{acl.subject} has no ACL; create it with createAcl")
    merged = merge_acl(apb.Acl.FromString(raw) if raw else None, acl)
    if len(merged.entries) > ENTRIES_MAX:
        return error_cls(Code.BAD_REQUEST, f"{acl.subject} would have {len(merged.entries)} policy entries; at most "
                                           f"{ENTRIES_MAX}: delete some first (deleteAcl --resources)")
    txn.put(acl.subject.encode(), merged.SerializeToString(), db=acls)
    return None


def _delete_acl(command: spb.AuthCommand, acls, txn, error_cls):
    raw = txn.get(command.name.encode(), db=acls)
    if raw is None:
        return error_cls(Code.NOT_FOUND, f"{command.name} has no ACL; nothing to delete")
    if not command.resources:
        txn.delete(command.name.encode(), db=acls)
        return None
    acl = apb.Acl.FromString(raw)
    gone = set(command.resources)
    kept = [e for e in acl.entries if e.resource not in gone]
    if len(kept) == len(acl.entries):
        return error_cls(Code.NOT_FOUND, f"{command.name} has no entry for {', '.join(sorted(gone))}")
    if kept:
        txn.put(command.name.encode(), apb.Acl(subject=acl.subject, entries=kept).SerializeToString(), db=acls)
    else:
        txn.delete(command.name.encode(), db=acls)
    return None


class AuthView:
    """Users and ACLs of this replica's applied state, cached until the next committed change."""

    def __init__(self, broker):
        self._broker = broker
        self._lock = threading.Lock()
        self._generation = -1
        self._users: dict[str, apb.User] = {}
        self._acls: dict[str, apb.Acl] = {}
        self._policies: dict[str, Policy] = {}  # subject -> its ACL ready for deciding, made on first use

    def _fresh(self) -> tuple[dict[str, apb.User], dict[str, apb.Acl]]:
        generation = self._broker.sm.auth_generation
        if generation != self._generation:
            with self._lock:
                db = self._broker.sm.db

                def scan(txn):
                    users = {k.decode(): apb.User.FromString(v) for k, v in txn.cursor(db=db[t.USERS])}
                    acls = {k.decode(): apb.Acl.FromString(v) for k, v in txn.cursor(db=db[t.ACLS])}
                    return users, acls

                self._users, self._acls = self._broker.read(scan)
                self._policies = {}
                self._generation = generation
        return self._users, self._acls

    def user(self, username: str) -> apb.User | None:
        return self._fresh()[0].get(username)

    def acl(self, subject: str) -> apb.Acl | None:
        return self._fresh()[1].get(subject)

    def policy(self, subject: str) -> Policy:
        acls = self._fresh()[1]
        policy = self._policies.get(subject)
        if policy is None:
            policy = self._policies[subject] = Policy(acls.get(subject))
        return policy

    def users(self) -> list[apb.User]:
        return [self._fresh()[0][k] for k in sorted(self._fresh()[0])]

    def acls(self) -> list[apb.Acl]:
        return [self._fresh()[1][k] for k in sorted(self._fresh()[1])]
