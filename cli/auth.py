"""`rocketraft admin <verb>` for ACL 2.0 (docs/security.md): RocketMQ 5's mqadmin user and ACL verbs.

    rocketraft admin createUser -u alice -p <secret key> [--user-type NORMAL|SUPER] [--user-status ENABLE|DISABLE]
    rocketraft admin updateUser -u alice [-p ...] [--user-type ...] [--user-status ...]
    rocketraft admin deleteUser -u alice | getUser -u alice | listUser [--filter al]
    rocketraft admin confirmUser -u alice   (a user made while the cluster had no secret: docs/security.md)
    rocketraft admin createAcl -s User:alice --resources Topic:orders,Group:billing -a Pub,Sub [-d ALLOW|DENY]
                               [--source-ip 10.0.0.0/8,...]
    rocketraft admin updateAcl ... (the subject must have an ACL) | deleteAcl -s User:alice [--resources ...]
    rocketraft admin getAcl -s User:alice | listAcl [--filter ...]

The password may come from a file (--password-file) rather than the command line, where `ps` shows it. These
calls need the cluster secret ($ROCKETRAFT_CLUSTER_SECRET or $ROCKETRAFT_CLUSTER_SECRET_FILE).
"""

from __future__ import annotations

import argparse

from google.protobuf.json_format import MessageToDict
from rich.console import Console

from rocketraft.client.admin import Admin
from rocketraft.client.auth_admin import AuthAdmin

VERBS = ("createUser", "updateUser", "deleteUser", "confirmUser", "getUser", "listUser",
         "createAcl", "updateAcl", "deleteAcl", "getAcl", "listAcl")
_NEEDS = {"createUser": ("username", "password"), "updateUser": ("username",), "deleteUser": ("username",),
          "confirmUser": ("username",),
          "getUser": ("username",), "createAcl": ("subject", "resources", "actions"),
          "updateAcl": ("subject", "resources", "actions"), "deleteAcl": ("subject",), "getAcl": ("subject",)}
_FLAGS = {"username": "-u", "password": "-p (or --password-file)", "subject": "-s", "resources": "--resources",
          "actions": "-a"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("users and ACLs (ACL 2.0)")
    group.add_argument("-u", "--username", help="createUser ... getUser: the user (its access key)")
    group.add_argument("-p", "--password", help="createUser/updateUser: its secret key (visible in ps: prefer "
                                                "--password-file)")
    group.add_argument("--password-file", help="a file holding the secret key")
    group.add_argument("--user-type", default="", help="NORMAL (default) or SUPER (may do anything)")
    group.add_argument("--user-status", default="", help="ENABLE (default) or DISABLE")
    group.add_argument("-s", "--subject", help="ACL verbs: User:<name> (or just the name)")
    group.add_argument("--resources", default="", help="comma-separated resource keys: *, Topic:orders, "
                                                       "Topic:order-*, Group:billing, Topic:* ...")
    group.add_argument("-a", "--actions", default="", help="comma-separated: Pub,Sub,Create,Update,Delete,Get,List,All")
    group.add_argument("-d", "--decision", default="ALLOW", help="ALLOW (default) or DENY")
    group.add_argument("--source-ip", default="", help="comma-separated IPs or CIDR blocks the entries apply to")
    group.add_argument("--filter", default="", help="listUser/listAcl: names containing this")


def required(args: argparse.Namespace) -> str | None:
    if args.password_file:
        make_it = (f"write the user's password (its secret key) there first, e.g. "
                   f"python3 -c 'import secrets; print(secrets.token_hex(16))' > {args.password_file}")
        try:
            with open(args.password_file, encoding="utf-8") as f:
                args.password = f.read().strip()
        except OSError as e:
            return f"--password-file {args.password_file}: cannot read it ({e.strerror}); {make_it}"
        if not args.password:
            return f"--password-file {args.password_file} is empty; {make_it}"
    missing = [_FLAGS[n] for n in _NEEDS.get(args.verb, ()) if not getattr(args, n)]
    return f"{args.verb} needs {' and '.join(missing)}" if missing else None


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


async def call(admin: Admin, args: argparse.Namespace):
    auth, verb = AuthAdmin(admin), args.verb
    if verb == "createUser":
        return await auth.create_user(args.username, args.password, args.user_type or "NORMAL",
                                      args.user_status or "ENABLE")
    if verb == "updateUser":
        return await auth.update_user(args.username, args.password or "", args.user_type, args.user_status)
    if verb == "deleteUser":
        return await auth.delete_user(args.username)
    if verb == "confirmUser":
        return await auth.confirm_user(args.username)
    if verb == "getUser":
        return _plain(await auth.get_user(args.username))
    if verb == "listUser":
        return [_plain(u) for u in await auth.list_users(args.filter)]
    if verb in ("createAcl", "updateAcl"):
        return await auth.create_acl(args.subject, _items(args.resources), _items(args.actions), args.decision,
                                     _items(args.source_ip), update=verb == "updateAcl")
    if verb == "deleteAcl":
        return await auth.delete_acl(args.subject, _items(args.resources))
    if verb == "getAcl":
        return _plain(await auth.get_acl(args.subject))
    return [_plain(a) for a in await auth.list_acls(args.filter)]


def _plain(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True)


def show(console: Console, verb: str, result) -> None:
    if verb in ("createUser", "updateUser", "deleteUser", "confirmUser", "createAcl", "updateAcl", "deleteAcl"):
        console.print(f"{verb} done on broker groups: {', '.join(result)}", highlight=False)
        return
    for item in result if isinstance(result, list) else [result]:
        console.print(item, highlight=False)
