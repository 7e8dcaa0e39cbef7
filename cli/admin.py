"""`rocketraft admin <verb>`: the mqadmin verbs RocketMQ users know, on the Admin client.

    rocketraft admin clusterList -n 127.0.0.1:9876 [-c DefaultCluster]
    rocketraft admin updateTopic -t orders -w 8
    rocketraft admin topicList | topicRoute -t orders | deleteTopic -t orders
    rocketraft admin updateSubGroup -g billing --fifo
    rocketraft admin queryMsgByKey -t orders -k order-42 | queryMsgById -t orders -i <id>
    rocketraft admin consumerProgress -g billing -t orders
    rocketraft admin updateTopic -t orders --namespace tenant-a            (a namespace's topics and groups)
    rocketraft admin createUser | updateUser | deleteUser | confirmUser | getUser | listUser  (ACL 2.0: cli_auth.py)
    rocketraft admin createAcl | updateAcl | deleteAcl | getAcl | listAcl
    rocketraft admin transferLeader --group broker-a [--to n1]
    rocketraft admin addReplica --group broker-a --replica n3-10.0.0.4:40911
    rocketraft admin removeReplica --group broker-a --replica n2

-c/--clusterName narrows clusterList, topicList, updateTopic, deleteTopic, updateSubGroup, transferLeader,
addReplica and removeReplica to one cluster's broker groups; the other verbs refuse it.
Every verb takes --json for machine-readable output. Exit status 0 on success, 1 on an error (printed as
the broker's code and message), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli import auth as cli_auth
from cli import tls as cli_tls
from rocketraft.client.admin import Admin, plain
from rocketraft.client.message import ReceivedMessage
from rocketraft.protocol import tls
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import MessageType

VERBS = ("clusterList", "topicList", "topicRoute", "updateTopic", "deleteTopic", "updateSubGroup",
         "queryMsgByKey", "queryMsgById", "consumerProgress", "transferLeader", "addReplica", "removeReplica",
         *cli_auth.VERBS)
# The verbs -c/--clusterName narrows to one cluster's broker groups. The others act on whatever has the topic (its
# route, messages and consumer progress span every group that has it) or on every group (users and ACLs), so -c is
# refused there rather than silently ignored.
CLUSTER_VERBS = ("clusterList", "topicList", "updateTopic", "deleteTopic", "updateSubGroup", "transferLeader",
                 "addReplica", "removeReplica")
MESSAGE_TYPES = {"NORMAL": MessageType.NORMAL, "FIFO": MessageType.FIFO, "DELAY": MessageType.DELAY,
                 "TRANSACTION": MessageType.TRANSACTION}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", choices=VERBS, help="what to do")
    parser.add_argument("-n", "--namesrvAddr", default="127.0.0.1:9876", help="NameServer(s), ';'-separated")
    parser.add_argument("-t", "--topic", help="topic name")
    parser.add_argument("-c", "--clusterName", default="",
                        help=f"only this cluster's broker groups: {', '.join(CLUSTER_VERBS)} (clusterList and "
                             "topicList show that cluster's groups and topics; the others change or look up groups "
                             "of that cluster only). Refused by every other verb")
    parser.add_argument("-w", "--writeQueueNums", type=int, help="queues per broker group (updateTopic; default 8)")
    parser.add_argument("-r", "--readQueueNums", type=int, help="must equal -w: one queue count per topic")
    parser.add_argument("--message-types", default="", help="updateTopic: comma-separated NORMAL,FIFO,DELAY,"
                        "TRANSACTION accepted (default all)")
    parser.add_argument("-g", "--consumerGroup", help="consumer group (updateSubGroup, consumerProgress)")
    parser.add_argument("--fifo", action="store_true", help="updateSubGroup: consume each message group in order")
    parser.add_argument("--max-delivery-attempts", type=int, default=0,
                        help="updateSubGroup: then %%DLQ%%<group> (0 = broker default, 17)")
    parser.add_argument("-k", "--msgKey", help="queryMsgByKey: the key")
    parser.add_argument("-i", "--msgId", help="queryMsgById: the message id")
    parser.add_argument("--max", type=int, default=32, help="queryMsgByKey: at most this many messages")
    parser.add_argument("--group", "-b", "--brokerName", dest="brokerGroup",
                        help="transferLeader, addReplica, removeReplica: the broker group (brokerName)")
    parser.add_argument("--to", default="", help="transferLeader: the new master: replica id (dLegerSelfId), "
                        "brokerId, or its client or Raft address (default: the most up-to-date replica)")
    parser.add_argument("--replica", default="", help="addReplica: the new replica as id-host:raftport (its "
                        "dLegerSelfId and dLegerPeers entry); removeReplica: a member's replica id, brokerId or Raft "
                        "address")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    cli_auth.add_arguments(parser)
    cli_tls.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=250)  # pipes get whole rows, never wrapped
    try:
        check = _required(args)
        if check:
            console.print(f"[red]error:[/red] {check}")
            return 2
        if args.verb in ("createUser", "updateUser") and args.password and not (args.tls or args.ca_file):
            print(f"warning: {args.verb} sends the user's password in plaintext (no --tls): anyone on the network "
                  f"path can read it. Where the servers speak TLS (tlsMode permissive or enforcing), add --tls "
                  f"--ca-file CA.pem or set {tls.CA_FILE_ENV} (docs/security.md, \"The cluster secret\")",
                  file=sys.stderr)
        result = asyncio.run(_call(args))
    except RocketraftError as exc:
        console.print(f"[red]error ({exc.code}):[/red] {escape(exc.message)}", highlight=False)
        return 1
    if args.json:
        print(json.dumps(plain(result), indent=2, default=str))
    else:
        _show(console, args.verb, result)
    return 0


def _required(args) -> str | None:
    if args.clusterName and args.verb not in CLUSTER_VERBS:
        why = "users and ACLs are changed and read on every broker group" if args.verb in cli_auth.VERBS else \
            "a topic's route, messages and consumer progress span every broker group that has the topic"
        return (f"-c/--clusterName does not apply to {args.verb}: {why}. Only {', '.join(CLUSTER_VERBS)} take "
                "-c")
    if args.verb in cli_auth.VERBS:
        return cli_auth.required(args)
    need = {"topicRoute": ["topic"], "updateTopic": ["topic"], "deleteTopic": ["topic"],
            "updateSubGroup": ["consumerGroup"], "queryMsgByKey": ["topic", "msgKey"],
            "queryMsgById": ["topic", "msgId"], "consumerProgress": ["consumerGroup", "topic"],
            "transferLeader": ["brokerGroup"], "addReplica": ["brokerGroup", "replica"],
            "removeReplica": ["brokerGroup", "replica"]}
    flags = {"topic": "-t", "consumerGroup": "-g", "msgKey": "-k", "msgId": "-i", "brokerGroup": "--group",
             "replica": "--replica"}
    missing = [flags[n] for n in need.get(args.verb, []) if not getattr(args, n)]
    if missing:
        return f"{args.verb} needs {' and '.join(missing)}"
    if args.readQueueNums and args.writeQueueNums and args.readQueueNums != args.writeQueueNums:
        return "rocketraft has one queue count per topic per group: give -w only (or -r equal to -w)"
    unknown = [t for t in args.message_types.split(",") if t and t.strip().upper() not in MESSAGE_TYPES]
    if unknown:
        return f"--message-types: unknown {unknown}; use {', '.join(MESSAGE_TYPES)}"
    return None


async def _call(args):
    async with Admin(config=cli_tls.client_config(args)) as admin:
        verb = args.verb
        if verb in cli_auth.VERBS:
            return await cli_auth.call(admin, args)
        if verb == "clusterList":
            return await admin.cluster_list(args.clusterName)
        if verb == "topicList":
            return await admin.topic_list(args.clusterName)
        if verb == "topicRoute":
            return await admin.topic_route(args.topic)
        if verb == "updateTopic":
            types = tuple(MESSAGE_TYPES[t.strip().upper()] for t in args.message_types.split(",") if t)
            queues = args.writeQueueNums or args.readQueueNums or 8
            return await admin.update_topic(args.topic, queues, types, args.clusterName)
        if verb == "deleteTopic":
            return await admin.delete_topic(args.topic, args.clusterName)
        if verb == "updateSubGroup":
            return await admin.create_group(args.consumerGroup, args.fifo, args.max_delivery_attempts,
                                            args.clusterName)
        if verb == "queryMsgByKey":
            return await admin.query_message_by_key(args.topic, args.msgKey, args.max)
        if verb == "queryMsgById":
            return await admin.query_message_by_id(args.topic, args.msgId)
        if verb == "transferLeader":
            return await admin.transfer_leader(args.brokerGroup, args.to, args.clusterName)
        if verb == "addReplica":
            return await admin.add_replica(args.brokerGroup, args.replica, args.clusterName)
        if verb == "removeReplica":
            return await admin.remove_replica(args.brokerGroup, args.replica, args.clusterName)
        return await admin.consumer_progress(args.consumerGroup, args.topic)


def _table(*columns: str) -> Table:
    table = Table(*columns, show_edge=False, pad_edge=False, header_style="bold")
    return table


def _show(console: Console, verb: str, result) -> None:
    if verb in cli_auth.VERBS:
        cli_auth.show(console, verb, result)
    elif verb == "clusterList":
        table = _table("cluster", "group", "replica", "brokerId", "role", "term", "address", "applied", "commit",
                       "vote", "clock")
        for g in result:
            for r in g.replicas:
                table.add_row(g.cluster, g.group, r.replica_id, str(r.broker_id), r.role, str(r.term), r.address,
                              str(r.applied_index), str(r.commit_index), _vote(r), r.clock_text)
        console.print(table)
        for g in result:  # what a replica says an operator must know (docs/operations.md, "Troubleshooting")
            for r in g.replicas:
                for text in r.notices:
                    console.print(f"{g.group}/{r.replica_id}: {text}", highlight=False)
    elif verb == "topicList":
        for name in result:
            console.print(name, highlight=False)
    elif verb == "topicRoute":
        table = _table("group", "master", "write queues", "replicas")
        for name, g in sorted(result.groups.items()):
            table.add_row(name, g.master or "(election)", str(len(g.write_queue_ids)), ", ".join(g.replicas))
        console.print(table)
    elif verb in ("updateTopic", "deleteTopic", "updateSubGroup"):
        console.print(f"{verb} done on broker groups: {', '.join(result)}", highlight=False)
    elif verb in ("queryMsgByKey", "queryMsgById"):
        _show_messages(console, result)
    elif verb == "transferLeader":
        routed = "the NameServer routes to it" if result.namesrv_routes_new_master else \
            "the NameServer does not route to it yet"
        console.print(f"{result.group}: master {result.old_master} -> {result.new_master} in {result.took_ms} ms; "
                      f"{routed}", highlight=False)
    elif verb in ("addReplica", "removeReplica"):
        done = "added" if verb == "addReplica" else "removed"
        listed = ("the NameServer lists it" if verb == "addReplica" else "the NameServer no longer lists it") \
            if result.namesrv_agrees else "the NameServer does not agree yet (it registers on its next heartbeat)"
        console.print(f"{result.group}: {result.replica} {done} by master {result.master} at Raft index {result.index} "
                      f"in {result.took_ms} ms; members now {', '.join(result.members)}; {listed}", highlight=False)
        if verb == "removeReplica" and len(result.members) < 3:
            console.print(f"WARNING: {result.group} now has {len(result.members)} member(s): it cannot lose another "
                          "replica and keep a master. Add one (addReplica) to survive a failure again",
                          highlight=False)
        if verb == "addReplica":
            console.print("it is a LEARNER (in no quorum: the group keeps its fault tolerance) until it has caught "
                          "up; then the master promotes it to voter. `rocketraft admin clusterList` shows it as "
                          "'learner' until then", highlight=False)
    else:
        _show_progress(console, result)


def _vote(replica) -> str:
    if replica.learner:
        return "learner" if replica.voter else "learner, catching up"
    if replica.voter:
        return "voter"
    target = replica.catch_up_index
    return f"catching up to {target}" if target > 0 else "catching up (target not known yet)"


def _show_messages(console: Console, messages: list[ReceivedMessage]) -> None:
    table = _table("message id", "queue", "offset", "stored", "tag", "keys", "body bytes")
    for m in messages:
        stored = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.store_ms / 1000)) if m.store_ms else "-"
        table.add_row(m.message_id, f"{m.queue.broker}/{m.queue.queue_id}", str(m.queue_offset), stored,
                      m.tag or "", ",".join(m.keys), str(len(m.body)))
    console.print(table)
    console.print(f"{len(messages)} message(s)")


def _show_progress(console: Console, queues) -> None:
    table = _table("topic", "group", "queue", "broker offset", "consumer offset", "in flight", "lag", "last stored")
    for q in queues:
        last = time.strftime("%H:%M:%S", time.localtime(q.last_store_ms / 1000)) if q.last_store_ms else "-"
        table.add_row(q.topic, q.broker, str(q.queue_id), str(q.broker_offset), str(q.consumer_offset),
                      str(q.inflight), str(q.lag), last)
    console.print(table)
    console.print(f"total lag: {sum(q.lag for q in queues)}")


