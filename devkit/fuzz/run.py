"""The fuzz run: which servers and services are fuzzed, the requests generated for each RPC (with hypothesis),
the calls in flight, the servers' health after each RPC (alive, no traceback in their logs), and the report."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import rocketraft
from devkit.devcluster import DevCluster
from devkit.waiting import wait_until
from rocketraft.client.admin import Admin
from rocketraft.client.auth_admin import AuthAdmin
from rocketraft.client.config import ClientConfig
from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol.wire import GRPC_OPTIONS, cpb, ipb, svc
from rocketraft.remoting import records
from rocketraft.remoting.codes import Request
from serverkit import remoting_acl

from . import access, frames, templates
from .access import Credentials, Who
from .calls import (
    KNOWN_FINDINGS,
    FrameReader,
    RemotingConnections,
    Verdict,
    call,
    call_remoting,
    known_finding,
    open_socket,
    plan_of,
)
from .messages import interesting_strings, request_bytes

V2 = svc.DESCRIPTOR.services_by_name["MessagingService"]
BROKER_ADMIN = ipb.DESCRIPTOR.services_by_name["BrokerAdmin"]
NAME_SERVER = ipb.DESCRIPTOR.services_by_name["NameServer"]
BROKER_AUTH = apb.DESCRIPTOR.services_by_name["BrokerAuth"]
FAST_CONSUME = cpb.DESCRIPTOR.services_by_name["FastConsume"]
TRACEBACK_MARKS = ("Traceback (most recent call last)", "Exception calling application", "Exception iterating")
# A mark counts where a traceback or grpc's log record of one begins: at the start of a line, or as the whole
# message of a log record ("<date> <time> <LEVEL> [<node>] <logger>: <mark>"), never inside a message, where a
# fuzzed name that happens to read "Exception iterating" is only echoed (hypothesis draws strings from constants
# in the source, this list included).
TRACEBACK_AT = re.compile(r"(?m)^(?:\d{4}-\d\d-\d\d [\d:,.]+ [A-Z]+ (?:\S+ )*?\S+: )?(?:"
                          + "|".join(re.escape(mark) for mark in TRACEBACK_MARKS) + ")")
EXAMPLES_KEPT = 3
# A malformed frame closes its connection with one such line (serverkit/remoting_server.py), naming the problem
REMOTING_CLOSED_AT = re.compile(r"(?m)^.* WARNING .*Remoting connection from \S+ closed: (\S.*)$")
DOORS = ("grpc", "remoting")
SETUP_TIMEOUT_S = 30.0
HEADERS = (("x-mq-client-id", "fuzz-client-1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"))
METADATA = st.sampled_from((
    HEADERS,
    (("x-mq-client-id", "fuzz-client-2"),) + HEADERS[1:],
    (),
    (("x-mq-client-id", ""),),
    (("x-mq-client-id", "x" * 4000), ("x-mq-namespace", "ns")),
    (("x-mq-client-id", "fuzz-client-1"), ("authorization", "MQv2-HMAC-SHA1 Credential=a, Signature=b")),
))
# A refusal that names an authentication or authorization problem (v2 status, gRPC status, Remoting code)
AUTH_REFUSALS = ("UNAUTHORIZED", "FORBIDDEN", "gRPC UNAUTHENTICATED", "gRPC PERMISSION_DENIED", "NO_PERMISSION")
OUTCOMES = ("ok", "no answer", "auth refused", "refused", "defect")  # "no answer": oneway, or a stream said nothing
USERS_SETTLE_S = 2.5  # the NameServer keeps a user it looked up for authCacheMillis (2000 ms by default)


@dataclass
class RpcResult:
    server: str
    rpc: str
    requests: int = 0
    ok: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)
    defect_kinds: collections.Counter = field(default_factory=collections.Counter)
    examples: list[str] = field(default_factory=list)
    known: collections.Counter = field(default_factory=collections.Counter)  # requests of known findings, not sent
    # --hardened: (credential kind, outcome) -> requests
    by_credential: collections.Counter = field(default_factory=collections.Counter)

    @property
    def defects(self) -> int:
        return sum(self.defect_kinds.values())

    def record(self, verdict: Verdict, kind: str, describe: Callable[[], str], credential: str = "") -> None:
        """One request's verdict; describe() names the request (called for a defect only); `credential`: the kind
        of credentials it went with (--hardened)."""
        self.requests += 1
        if credential:
            outcome = "auth refused" if verdict.kind == "refused" and verdict.detail in AUTH_REFUSALS \
                else "no answer" if verdict.kind == "ok" and not verdict.answered else verdict.kind
            self.by_credential[(credential, outcome)] += 1
            kind = f"{kind} ({credential})"
        if verdict.kind == "ok":
            self.ok += 1
        elif verdict.kind == "refused":
            self.refused[verdict.detail] += 1
        else:
            self.defect(verdict.detail, f"{kind} request {describe()}")

    def defect(self, what: str, context: str) -> None:
        self.defect_kinds[what] += 1
        if len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(f"{what} <- {context}")

    def as_json(self) -> dict:
        return {"server": self.server, "rpc": self.rpc, "requests": self.requests, "ok": self.ok,
                "refused": dict(self.refused), "defects": dict(self.defect_kinds), "examples": self.examples,
                "known": dict(self.known),
                "credentials": {f"{c} {o}": n for (c, o), n in sorted(self.by_credential.items())}}


def _describe(payload: bytes, request_cls) -> str:
    try:
        text = str(request_cls.FromString(payload)).replace("\n", " ")
    except Exception:  # noqa: BLE001 - undecodable is what it is; show the bytes
        text = f"bytes {payload[:64].hex()}"
    return text[:300] + (" ..." if len(text) > 300 else "")


@dataclass(frozen=True)
class Server:
    label: str  # "namesrv", "master n0", "follower n1"
    address: str
    services: tuple[tuple[ServiceDescriptor, dict[str, Message]], ...]
    other_address: str = ""  # another server's: where a proof made for it is refused here

    @property
    def namesrv(self) -> bool:
        return self.label == "namesrv"


@dataclass(frozen=True)
class RemotingDoor:
    label: str  # "namesrv", "master n0", "follower n1"
    address: str  # its Remoting port
    log_path: str
    codes: tuple[int, ...]  # request codes fuzzed (templates.UNKNOWN_CODE: codes nobody serves)


def code_name(code: int) -> str:
    return "UNKNOWN_CODE" if code == templates.UNKNOWN_CODE else Request(code).name


def namesrv_remoting_codes() -> tuple[int, ...]:
    """The request codes of the NameServer's Remoting handler table (namesrv/remoting.py), unknown codes last."""
    import inspect

    from namesrv.remoting import NameServerRemoting

    names = re.findall(r"Request\.(\w+):", inspect.getsource(NameServerRemoting.start))
    return (*sorted(Request[name] for name in names), templates.UNKNOWN_CODE)


def broker_remoting_codes() -> tuple[int, ...]:
    """The request codes of the broker's Remoting handler table (broker/remoting_table.py), unknown codes last."""
    from broker import remoting_table

    return (*sorted(remoting_table.CODES), templates.UNKNOWN_CODE)


class Fuzzer:
    def __init__(self, cluster: DevCluster, requests: int, seed: int, concurrency: int, only: set[str],
                 progress: TextIO | None = None, doors: tuple[str, ...] = DOORS, send_known: bool = False,
                 remoting_requests: int | None = None, credentials: Credentials | None = None):
        """`credentials`: the hardened run's users and secret (None: a cluster without ACL or secret, and requests
        without credentials but the bogus ones of METADATA)."""
        self.cluster, self.requests, self.seed, self.concurrency = cluster, requests, seed, concurrency
        self.credentials = credentials
        self._channels: dict[str, object] = {}
        self.only, self.progress, self.doors, self.send_known = only, progress, doors, send_known
        self.remoting_requests = remoting_requests or requests
        self.connections = RemotingConnections()
        self._defect_files = 0
        self.names = templates.Names(cluster=cluster.cluster)
        self.strings = interesting_strings(self.names.all())
        self._log_offsets: dict[str, int] = {}
        self._generated: dict[str, list] = {}

    def servers(self) -> list[Server]:
        master = self.cluster.wait_master()
        follower = next(i for i in self.cluster.ids if i != master)
        v2, admin, ns = templates.v2(self.names), templates.broker_admin(self.names), templates.name_server(self.names)
        fast = templates.fast_consume(self.names)
        broker = ((V2, v2), (BROKER_ADMIN, admin), (BROKER_AUTH, {}), (FAST_CONSUME, fast))
        master_address, follower_address = self.cluster.address_of[master], self.cluster.address_of[follower]
        return [Server("namesrv", self.cluster.namesrv_address, ((V2, v2), (NAME_SERVER, ns)), master_address),
                Server(f"master {master}", master_address, broker, follower_address),
                Server(f"follower {follower}", follower_address, broker, master_address)]

    def channel(self, address: str):
        """A channel that adds nothing to the fuzzer's calls (the cluster's own channels sign every call with the
        cluster secret); over TLS where the cluster has it."""
        if address not in self._channels:
            self._channels[address] = self.cluster.client_tls.channel(address, GRPC_OPTIONS)
        return self._channels[address]

    def remoting_doors(self) -> list[RemotingDoor]:
        master = self.cluster.wait_master()
        follower = next(i for i in self.cluster.ids if i != master)
        broker = broker_remoting_codes()
        namesrv = self.cluster.namesrv_procs[0]
        return [RemotingDoor("namesrv", self.cluster.namesrv_remoting_addresses[0], namesrv.log_path,
                             namesrv_remoting_codes()),
                *(RemotingDoor(f"{role} {replica}", self.cluster.remoting_of[replica],
                               self.cluster.brokers[replica].log_path, broker)
                  for role, replica in (("master", master), ("follower", follower)))]

    def run(self) -> list[RpcResult]:
        self._logs_since_last_look()
        if self.credentials is not None:
            self._prepare(self.names.topic, self.names.group)
            self._make_users()
        results = []
        with ThreadPoolExecutor(self.concurrency) as pool:
            if "grpc" in self.doors:
                for server in self.servers():
                    for service, service_templates in server.services:
                        for method in service.methods:
                            if self.only and method.name not in self.only:
                                continue
                            results.append(self._fuzz_rpc(pool, server, service, method, service_templates))
                            if self.credentials is not None and service is BROKER_AUTH:
                                self._make_users(after_fuzzing=True)
            if "remoting" in self.doors:
                selected = self.remoting_doors()
                codes = {c for door in selected for c in door.codes if self._remoting_selected(c)}
                if codes:
                    remoting_templates = templates.remoting(self.names, self._stored_message())
                    for door in selected:
                        for code in door.codes:
                            if code in codes:
                                results.append(self._fuzz_code(pool, door, code, remoting_templates))
        results.append(self._still_serves())
        return results

    def _remoting_selected(self, code: int) -> bool:
        return not self.only or "Remoting" in self.only or code_name(code) in self.only

    def _stored_message(self) -> templates.StoredMessage:
        """A message sent through the master's Remoting door, which the requests that name one by its commit log
        offset (view by id, send back, end transaction) name."""
        self._prepare(self.names.topic, self.names.group)
        message_id = "FUZZSTORED0000000000000000000001"
        ext = {"a": "fuzz-producer", "b": self.names.topic, "e": "1", "f": "0", "g": "1764000000000", "h": "0",
               "i": records.format_properties({"UNIQ_KEY": message_id, "KEYS": "k1"}), "j": "0"}
        found: list[int] = []

        if self.credentials is not None:
            root = self.credentials.root
            ext = remoting_acl.sign(ext, b"stored", root.name, root.password)

        def sent() -> bool:
            plan = plan_of(data := frames.request(Request.SEND_MESSAGE_V2, ext, b"stored", 0, 1))
            try:
                with frames_socket(self.cluster.remoting_of[self.cluster.wait_master()]) as sock:
                    sock.sendall(data)
                    answer = read_command(sock, plan.deadline_s)
            except (OSError, RuntimeError):
                return False
            if answer.code != 0:
                return False
            found.append(records.parse_offset_message_id(answer.ext["msgId"].split(",")[0])[1])
            return True

        wait_until(sent, SETUP_TIMEOUT_S, f"a send through the master's Remoting door (logs in "
                                          f"{self.cluster.base_dir})")
        return templates.StoredMessage(found[0], message_id)

    def _fuzz_code(self, pool, door: RemotingDoor, code: int, remoting_templates: dict) -> RpcResult:
        result = RpcResult(door.label, f"Remoting.{code_name(code)}")
        self._prepare(self.names.topic, self.names.group)
        ext, body = remoting_templates.get(code, ({}, b""))
        key = f"remoting.{code}"
        if key not in self._generated:
            self._generated[key] = generate_frames(code, ext, body, self.strings, self.remoting_requests,
                                                    self.seed, self.credentials)
        requests = self._generated[key]
        tls_permissive = self.cluster.tls_mode == "permissive"
        plans = [plan_of(data, tls_permissive) for _kind, data, _credential in requests]
        known = ["" if self.send_known else known_finding(data, plan) for (_kind, data, _), plan in
                 zip(requests, plans, strict=True)]
        calls = [None if skip else pool.submit(call_remoting, self.connections, door.address, data, plan)
                 for (_kind, data, _), plan, skip in zip(requests, plans, known, strict=True)]
        for (kind, data, credential), plan, skip, future in zip(requests, plans, known, calls, strict=True):
            if skip:
                result.requests += 1
                result.known[skip] += 1
                continue
            verdict = self._judge_remoting(future.result(), plan)
            result.record(verdict, kind, lambda d=data, p=plan: self._describe_frames(d, p), credential)
        warned = sum(plan.warns for plan, skip in zip(plans, known, strict=True) if not skip)
        self._check_health(result, warnings={door.log_path: warned})
        if self.progress:
            print(f"{door.label:14} {result.rpc:58} {result.requests:6} requests, {result.defects} defects",
                  file=self.progress, flush=True)
        return result

    def _judge_remoting(self, verdict: Verdict, plan) -> Verdict:
        """--hardened: a request answered SUCCESS must have been signed by a user it was allowed for."""
        if self.credentials is None or verdict.kind != "ok" or not verdict.succeeded:
            return verdict
        for request in plan.requests:
            if request.opaque not in verdict.succeeded:
                continue
            who = self.credentials.remoting_who(request.ext, request.body)
            rule = access.remoting_rule(request.code, request.ext, request.body)
            if access.may(who, rule, self.names) is False:
                return unauthorized(who, rule)
        return verdict

    def _describe_frames(self, data: bytes, plan) -> str:
        """The frame(s) decoded as the server reads them, and the exact bytes, kept in a file of the run's dir."""
        self._defect_files += 1
        path = os.path.join(self.cluster.base_dir, "fuzz-defects", f"remoting-{self._defect_files}.bin")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return f"{describe_frames(data)}{'; ' + plan.problem if plan.problem else ''} (its {len(data)} bytes: {path})"

    def _prepare(self, topic: str, group: str) -> None:
        """Creates the topic and group, waiting out an election (a fan-out needs a master). A topic the fuzzing made
        again with other settings (more queues, which are never removed, so creating it with 8 is refused) is kept."""
        def ready() -> bool:
            if not _succeeds(lambda: self.cluster.create_topic(topic)) and not self._topic_exists(topic):
                return False
            return _succeeds(lambda: self.cluster.create_group(group))

        wait_until(ready, SETUP_TIMEOUT_S, f"creating topic {topic} and group {group} (logs in "
                                           f"{self.cluster.base_dir})")

    def _topic_exists(self, topic: str) -> bool:
        status = self.cluster.replica_status(self.cluster.wait_master())
        return status is not None and topic in {t.name for t in status.topics}

    def _fuzz_rpc(self, pool, server: Server, service: ServiceDescriptor, method: MethodDescriptor,
                  service_templates: dict[str, Message]) -> RpcResult:
        result = RpcResult(server.label, f"{service.name}.{method.name}")
        # The fuzzed topic and group exist for every RPC: a valid DeleteTopic (fuzzed earlier) deletes the topic, and
        # every RPC after it would meet only TOPIC_NOT_FOUND (the 10,000-per-RPC run of 2026-11-26 saw it)
        self._prepare(self.names.topic, self.names.group)
        requests = self._requests_for(service, method, templates.template_for(method, service_templates))
        channel = self.channel(server.address)
        request_cls = type(templates.template_for(method, service_templates))
        calls = [pool.submit(self._send, channel, server, service, method, payload, metadata, credential, variant)
                 for _kind, payload, metadata, credential, variant in requests]
        for (kind, payload, _, credential, _), future in zip(requests, calls, strict=True):
            result.record(future.result(), kind, lambda p=payload: _describe(p, request_cls), credential)
        self._check_health(result)
        if self.progress:
            print(f"{server.label:14} {result.rpc:58} {result.requests:6} requests, {result.defects} defects",
                  file=self.progress, flush=True)
        return result

    def _requests_for(self, service: ServiceDescriptor, method: MethodDescriptor, template: Message) -> list:
        """self.requests (kind, bytes, metadata, credential kind, its variant) for this RPC; the same ones for every
        server that serves it."""
        key = f"{service.full_name}.{method.name}"
        if key not in self._generated:
            self._generated[key] = generate(method, template, self.strings, self.requests, self.seed,
                                            self.credentials is not None)
        return self._generated[key]

    def _send(self, channel, server: Server, service: ServiceDescriptor, method: MethodDescriptor, payload: bytes,
              metadata: tuple, credential: str, variant: int) -> Verdict:
        """One call (runs on the pool). --hardened: with the credentials of its kind, made now (they carry the
        time), and judged by who they prove the caller is; a replayed proof is sent a second time after its first
        answer, and that second answer is judged as one without credentials."""
        if not credential:
            return call(channel, service.full_name, method, payload, metadata)
        path = f"/{service.full_name}/{method.name}"
        extra = self.credentials.grpc_metadata(credential, variant, path, server.address, server.other_address,
                                               None if method.client_streaming else payload)
        sent = _client_headers(metadata, self.credentials.user_of(credential)) + extra
        verdict = self._judge_grpc(call(channel, service.full_name, method, payload, sent),
                                   self.credentials.who(credential), server, service, method, payload, sent)
        if credential == "proof-replayed" and verdict.kind != "defect":
            verdict = self._judge_grpc(call(channel, service.full_name, method, payload, sent), Who.NOBODY, server,
                                       service, method, payload, sent)
        return verdict

    def _judge_grpc(self, verdict: Verdict, who: Who, server: Server, service: ServiceDescriptor,
                    method: MethodDescriptor, payload: bytes, metadata: tuple) -> Verdict:
        if verdict.kind != "ok" or not verdict.answered:
            return verdict
        if access.grpc_may(who, server.namesrv, service.name, method, payload, metadata, self.names) is False:
            request = GetMessageClass(method.input_type).FromString(payload)
            return unauthorized(who, access.grpc_rule(server.namesrv, service.name, method.name, request))
        return verdict

    def _make_users(self, after_fuzzing: bool = False) -> None:
        """Creates this run's users and the tenant's ACL (again), through the admin client with the cluster secret.
        After a BrokerAuth RPC was fuzzed (its requests with a valid proof may have changed any user), they are
        made again, and when a type, status or ACL had changed the NameServer's cache of users is waited out."""
        creds, names = self.credentials, self.names
        tenant_acl = {(f"Topic:{names.topic}", ("Pub", "Sub")), (f"Group:{names.group}", ("Pub", "Sub"))}

        async def make() -> bool:
            config = ClientConfig(namesrv=(self.cluster.namesrv_address,), cluster_secret=creds.secret,
                                  access_key="", secret_key="", tls=self.cluster.certs is not None,
                                  tls_ca_file=self.cluster.certs.ca_file if self.cluster.certs else "")
            async with Admin(config=config) as admin:
                auth = AuthAdmin(admin)
                users = {u.username: (u.type, u.status) for u in await auth.list_users()}
                acls = {a.subject: {(e.resource, tuple(e.actions)) for e in a.entries if e.decision == apb.ALLOW}
                        for a in await auth.list_acls()}
                changed = any(users.get(u.name) != (apb.UserType.Value(u.type), apb.ENABLE) for u in creds.users) \
                    or acls.get(f"User:{creds.tenant.name}") != tenant_acl \
                    or any(f"User:{u.name}" in acls for u in (creds.root, creds.stranger))
                for user in creds.users:
                    if user.name in users:
                        await auth.delete_user(user.name)  # and its ACL
                    await auth.create_user(user.name, user.password, user.type)
                await auth.create_acl(f"User:{creds.tenant.name}", [r for r, _ in sorted(tenant_acl)], ["Pub", "Sub"])
                return changed

        changed = asyncio.run(make())
        if after_fuzzing and changed:
            time.sleep(USERS_SETTLE_S)

    def _check_health(self, result: RpcResult, warnings: dict[str, int] | None = None) -> None:
        """Every process alive, no traceback in a log; `warnings`: log path -> the malformed frames sent to its
        server's Remoting door, each of which must have closed its connection with one WARNING line."""
        for proc in [*self.cluster.namesrv_procs, *self.cluster.brokers.values()]:
            if not proc.alive:
                result.defect(f"{proc.name} exited", f"after {result.rpc}; its log: {proc.log_path}")
        for path, text in self._logs_since_last_look().items():
            if warnings and path in warnings:
                lines = len(REMOTING_CLOSED_AT.findall(text))
                if lines != warnings[path]:
                    result.defect(f"{warnings[path]} malformed frames closed with {lines} WARNING lines in "
                                  f"{os.path.basename(path)}", "the frames of this code (each must close its "
                                  "connection with one line naming the problem)")
            found = TRACEBACK_AT.search(text)
            if found:
                at = found.start()
                result.defect(f"a traceback in {os.path.basename(path)}", text[max(0, at - 300):at + 1000])

    def _logs_since_last_look(self) -> dict[str, str]:
        new = {}
        for proc in [*self.cluster.namesrv_procs, *self.cluster.brokers.values()]:
            with open(proc.log_path, "rb") as f:
                f.seek(self._log_offsets.get(proc.log_path, 0))
                new[proc.log_path] = f.read().decode(errors="replace")
                self._log_offsets[proc.log_path] = f.tell()
        return new

    def _still_serves(self) -> RpcResult:
        """After the fuzzing, a producer and a consumer on a new topic and group still work."""
        result = RpcResult("cluster", "send and receive after fuzzing")
        topic, group = "fuzz-after", "fuzz-after-group"
        try:
            self._prepare(topic, group)
            config = self._client_config()
            with rocketraft.Producer(self.cluster.namesrv_address, config=config) as producer:
                producer.send(rocketraft.Message(topic, b"after the fuzz"))
            with rocketraft.SimpleConsumer(self.cluster.namesrv_address, group=group, subscriptions={topic: "*"},
                                           await_duration_s=2, config=config) as consumer:
                got = [m.body for _ in range(10) for m in consumer.receive(max_messages=16)]
            result.requests = 1
            if b"after the fuzz" in got:
                result.ok = 1
            else:
                result.defect("a message sent after fuzzing was not received", f"received {got[:3]}")
        except Exception as exc:  # noqa: BLE001 - any failure here is the finding
            result.requests = 1
            result.defect(f"the cluster no longer serves: {type(exc).__name__}: {exc}", "a send and a receive")
        self._check_health(result)
        return result


    def _client_config(self) -> ClientConfig | None:
        """A producer's and consumer's config: --hardened, the SUPER user's credentials over TLS."""
        if self.credentials is None:
            return None
        root, certs = self.credentials.root, self.cluster.certs
        return ClientConfig(namesrv=(self.cluster.namesrv_address,), cluster_secret="", access_key=root.name,
                            secret_key=root.password, tls=certs is not None, tls_ca_file=certs.ca_file if certs else "")


def unauthorized(who: Who, rule: access.Rule) -> Verdict:
    needs = "the cluster secret" if rule.secret else "an admin's right" if rule.admin else \
        ", ".join(f"{'/'.join(sorted(n.actions))} on {n.kind}:{n.name[:80]}" for n in rule.needs) or "nothing"
    return Verdict("defect", f"answered without authorization: {who.value}, a call that needs {needs}"
                             f"{' and a right on the stored message' if rule.stored else ''}")


def _client_headers(metadata: tuple, user) -> tuple:
    """The client headers of a hardened call: METADATA's without its bogus authorization (the credential kinds
    make those), and a user's client id its own (a client id belongs to the first user that used it)."""
    out = []
    for key, value in metadata:
        if key == "authorization":
            continue
        if key == "x-mq-client-id" and user is not None and value.startswith("fuzz-client-"):
            value = f"{value}-{user.name}"
        out.append((key, value))
    return tuple(out)


def _succeeds(action) -> bool:
    try:
        action()
        return True
    except RuntimeError:
        return False


def generate(method: MethodDescriptor, template: Message, strings: tuple[str, ...], count: int,
             seed_value: int, hardened: bool = False) -> list[tuple[str, bytes, tuple, str, int]]:
    """`count` requests (kind, bytes, metadata, credential kind, its variant) for one RPC, drawn by hypothesis
    (generation only: no shrinking, no database); the credential kind is "" unless `hardened`."""
    collected: list = []
    credentials = st.tuples(st.sampled_from(access.GRPC_CREDENTIALS), st.integers(0, access.GARBAGE_VARIANTS - 1)) \
        if hardened else st.just(("", 0))
    strategy = st.tuples(request_bytes(method.input_type, template, strings), METADATA, credentials)
    attempt = 0
    while len(collected) < count:
        @seed(seed_value * 1_000 + attempt)
        @settings(max_examples=count - len(collected), database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw(item):
            (kind, payload), metadata, (credential, variant) = item
            collected.append((kind, payload, metadata, credential, variant))

        draw()
        attempt += 1
    return collected[:count]


def generate_frames(code: int, ext: dict[str, str], body: bytes, strings: tuple[str, ...], count: int,
                    seed_value: int, credentials: Credentials | None = None) -> list[tuple[str, bytes, str]]:
    """`count` (kind, bytes, credential kind) for one Remoting request code, drawn by hypothesis (generation only);
    with `credentials` (--hardened) each request is signed as one kind of access.REMOTING_CREDENTIALS says."""
    collected: list = []
    unknown = templates.UNKNOWN_CODES if code == templates.UNKNOWN_CODE else ()
    if credentials is None:
        strategy = frames.requests(code, ext, body, strings, unknown).map(lambda kd: (*kd, ""))
    else:
        signed = {kind: frames.requests(code, ext, body, strings, unknown, credentials.remoting_signer(kind))
                  .map(lambda kd, kind=kind: (*kd, kind)) for kind in access.REMOTING_CREDENTIALS}
        strategy = st.sampled_from(access.REMOTING_CREDENTIALS).flatmap(signed.__getitem__)
    attempt = 0
    while len(collected) < count:
        @seed(seed_value * 1_000 + attempt + (code & 0xFFFF) * 7)
        @settings(max_examples=count - len(collected), database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw(item):
            collected.append(item)

        draw()
        attempt += 1
    return collected[:count]


def frames_socket(address: str):
    return open_socket(address)


def read_command(sock, timeout_s: float):
    return FrameReader(sock).next(time.monotonic() + timeout_s)


def describe_frames(data: bytes) -> str:
    """Each frame in the bytes as the server decodes it (code, flag, opaque, serialize, header fields, body), then
    what is left; values cut to 80 characters."""
    from rocketraft.remoting import frame

    parts, at = [], 0
    while at + 4 <= len(data):
        (length,) = frame.LENGTH.unpack_from(data, at)
        if length < 4 or at + 4 + length > len(data):
            break
        try:
            c = frame.decode(data[at + 4:at + 4 + length])
        except Exception:  # noqa: BLE001 - not decodable: shown as bytes below
            break
        ext = {k[:40]: (v[:80] + f"...({len(v)} chars)" if len(v) > 80 else v) for k, v in list(c.ext.items())[:30]}
        parts.append(f"[code {c.code} flag {c.flag} opaque {c.opaque} serialize {c.serialize} language {c.language} "
                     f"version {c.version} remark {c.remark[:80]!r} ext {ext!r} body {c.body[:120]!r}"
                     f"{f'...({len(c.body)} bytes)' if len(c.body) > 120 else ''}]")
        at += 4 + length
    if at < len(data):
        parts.append(f"bytes {data[at:at + 96].hex()}{'...' if len(data) - at > 96 else ''}")
    return " ".join(parts) or "no bytes"


def report_lines(results: list[RpcResult], elapsed_s: float) -> list[str]:
    lines = [f"{'server':16} {'rpc':58} {'requests':>8} {'ok':>7} {'refused':>8} {'defects':>7}  top refusals"]
    for r in results:
        top = ", ".join([f"{name} {n}" for name, n in r.refused.most_common(3)]
                        + [f"KNOWN {name} {n} (not sent)" for name, n in r.known.items()])
        lines.append(f"{r.server:16} {r.rpc:58} {r.requests:8} {r.ok:7} {sum(r.refused.values()):8} "
                     f"{r.defects:7}  {top}")
    total = sum(r.requests for r in results)
    defects = [r for r in results if r.defects]
    lines.append(f"{total} requests to {len(results) - 1} RPCs in {elapsed_s:.0f} s: "
                 f"{sum(r.defects for r in results)} defects")
    known = collections.Counter()
    for r in results:
        known.update(r.known)
    for known_finding_ in KNOWN_FINDINGS:
        if known[known_finding_.name]:
            lines.append(f"KNOWN FINDING {known_finding_.name}: {known[known_finding_.name]} requests not sent "
                         f"(--send-known sends them): {known_finding_.reason}")
    lines.extend(credential_lines(results))
    for r in defects:
        lines.append(f"DEFECTS in {r.server} {r.rpc}: {dict(r.defect_kinds)}")
        lines.extend(f"  e.g. {example}" for example in r.examples)
    return lines


def credential_lines(results: list[RpcResult]) -> list[str]:
    """--hardened: requests by the credentials they went with and their outcome (none without credentials)."""
    lines = []
    for door, kinds in (("gRPC", access.GRPC_CREDENTIALS), ("Remoting", access.REMOTING_CREDENTIALS)):
        counts = collections.Counter()
        for r in results:
            if r.rpc.startswith("Remoting.") == (door == "Remoting"):
                counts.update(r.by_credential)
        if not counts:
            continue
        lines.append(f"{door + ' credentials':28} {'requests':>8} " + " ".join(f"{o:>12}" for o in OUTCOMES))
        for credential in kinds:
            row = [counts[(credential, o)] for o in OUTCOMES]
            if sum(row):
                lines.append(f"{credential:28} {sum(row):8} " + " ".join(f"{n:12}" for n in row))
    return lines
