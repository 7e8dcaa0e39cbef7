"""A local cluster of real processes: NameServers (one by default) and one broker group of N replicas.

Used by `rocketraft dev`, the tests and the benchmarks. Every process is a real `python -m namesrv` /
`python -m broker` with its own store under `base_dir`, talking gRPC and Raft over 127.0.0.x sockets.

    with DevCluster("/tmp/rr") as cluster:
        cluster.start()
        cluster.wait_master()
        cluster.create_topic("orders")

A second group joins the same NameServers with `external_namesrv`, which starts no NameServer of its own:

    second = DevCluster("/tmp/rr-b", group="broker-b", external_namesrv=tuple(cluster.namesrv_addresses))
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import grpc
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from broker import config as broker_config
from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.routing import is_master
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, ipb, ipb_grpc, pb, split_address, svc, svc_grpc
from serverkit import parentwatch

from . import certs as dev_certs
from .clockshift import ClockShift
from .localcluster import free_port as dledger_free_port
from .localcluster import free_port_block, reserve_ports
from .logtail import log_tail
from .pause import pause

READY_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    return dledger_free_port(host)


def free_dev_ports() -> tuple[int, int]:
    """(--namesrv-port, --broker-port) for a `rocketraft dev` of three replicas: every port it then listens on by
    number (DevCluster.fixed_ports) is free now, and reserved in this process. One free port per flag was not
    enough: dev also listens on the NameServer's port + 1 and the brokers' ports + 1, + 2 and + 2830."""
    namesrv = free_port_block(["127.0.0.1"], (0, 1))
    offset = broker_config.REMOTING_PORT_OFFSET
    broker = free_port_block(["127.0.0.1"], (0, 1, 2, offset, offset + 1, offset + 2))
    return namesrv, broker


def scrape_metrics(address: str, timeout_s: float = 5.0) -> list[Sample]:
    """Every sample a process's GET http://<address>/metrics serves (DevCluster.metrics_address_of and
    namesrv_metrics_addresses), parsed by prometheus_client."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def metric_value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of the samples named `name` whose labels include `labels`; None if there is none."""
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


@dataclass
class Proc:
    name: str
    args: list[str]
    log_path: str
    process: subprocess.Popen | None = None
    env_extra: dict = field(default_factory=dict)  # this process's own additions to the environment it is given

    def start(self, env: dict) -> None:
        self.spawn(env)
        self.wait_ready()

    def spawn(self, env: dict) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, env={**env, **self.env_extra},
                                        start_new_session=True)
        log.close()

    def wait_ready(self) -> None:
        """Until the process prints its 'listening' line; a process that does not is killed, and the error quotes
        the end of its log."""
        ready, _, _ = select.select([self.process.stdout], [], [], READY_TIMEOUT_S)
        line = self.process.stdout.readline().decode() if ready else ""
        if "listening" not in line:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"{self.name} did not start within {READY_TIMEOUT_S:.0f}s (exit code "
                               f"{self.process.returncode}, first line {line!r}); the end of {self.log_path}:\n"
                               f"{log_tail(self.log_path)}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig`; a SIGSTOP returns only once every thread of the process has stopped (devkit.pause)."""
        if self.alive:
            if sig == signal.SIGSTOP:
                pause(self.process.pid)
            else:
                os.kill(self.process.pid, sig)

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_all([self], timeout_s)


def start_all(procs: list[Proc], env: dict) -> None:
    """Start the processes side by side (each spends most of its start importing, on a core of its own), then
    wait until each is listening."""
    for proc in procs:
        proc.spawn(env)
    for proc in procs:
        proc.wait_ready()


def stop_all(procs: list[Proc], timeout_s: float = 10.0) -> None:
    """SIGTERM every live process at once, then wait for each; one still running after timeout_s is killed."""
    live = [proc for proc in procs if proc.alive]
    for proc in live:
        proc.process.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in live:
        try:
            proc.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.process.kill()
            proc.process.wait()


@dataclass
class DevCluster:
    base_dir: str
    replicas: int = 3
    group: str = "broker-a"
    cluster: str = "DefaultCluster"
    hosts: tuple[str, ...] = ()  # one per replica; default all 127.0.0.1
    flush: str = "ASYNC_FLUSH"
    broker_settings: dict = field(default_factory=dict)  # extra BrokerConfig keys for every replica
    namesrv_port: int = 0  # the first NameServer's port (0 = a free one)
    broker_ports: tuple[int, ...] = ()
    log_level: str = "INFO"
    namesrvs: int = 1  # NameServer processes to run; every replica registers with all of them
    external_namesrv: tuple[str, ...] = ()  # run no NameServer; register with these (another cluster's)
    metrics: bool = True  # every process serves Prometheus metrics on a free port of its own (docs/metrics.md)
    # internal calls must prove this secret ("" = off, as before); given to the processes through the environment,
    # and every call of this kit's channels is signed with it (docs/security.md)
    cluster_secret: str = field(default="", repr=False)
    namesrv_args: tuple[str, ...] = ()  # extra `python -m namesrv` flags (e.g. --authenticationEnabled true)
    # TLS on every NameServer and broker port ("" = off): permissive or enforcing, with a CA and certificates made
    # in base_dir/tls (devkit.certs); the kit's own channels verify the servers with that CA (and with
    # tls_client_auth "require" present the client certificate). The Raft port gets a random dLegerPassword when
    # there is no cluster secret (a TLS broker refuses an unauthenticated Raft port)
    tls_mode: str = ""
    tls_client_auth: str = tls.CLIENT_AUTH_NONE
    # every replica runs with a wall clock the test can shift (devkit/clockshift.py: `clocks[replica_id].set(s)`)
    clock_shifts: bool = False

    def __post_init__(self) -> None:
        self.base_dir = os.path.abspath(self.base_dir)
        self.certs = dev_certs.make(os.path.join(self.base_dir, "tls")) if self.tls_mode else None
        self._raft_password = secrets.token_hex(16) if self.tls_mode and not self.cluster_secret else ""
        os.makedirs(os.path.join(self.base_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.base_dir, "conf"), exist_ok=True)
        self.ids = [f"n{i}" for i in range(self.replicas)]
        self.peers_of: dict[str, list[str]] = {}  # dLegerPeers of replicas added later (new_replica)
        hosts = self.hosts or ("127.0.0.1",) * self.replicas
        self.host_of = dict(zip(self.ids, hosts, strict=True))
        self.namesrv_addresses = list(self.external_namesrv) or self._own_namesrv_addresses()
        self.namesrv_address = self.namesrv_addresses[0]
        reserve_ports(self.fixed_ports())  # a Raft or metrics port drawn below is never one of them
        ports = self.broker_ports or tuple(free_port(h) for h in hosts)
        self.address_of = {i: f"{self.host_of[i]}:{p}" for i, p in zip(self.ids, ports, strict=True)}
        self.raft_of = {i: f"{self.host_of[i]}:{free_port(self.host_of[i])}" for i in self.ids}
        # each replica's and NameServer's Remoting door (RocketMQ 4.x clients), on free ports
        # (fixed ports, as `rocketraft dev` asks: the servers' own defaults, gRPC + 2830 and NameServer gRPC + 1)
        self.remoting_of = {i: f"{self.host_of[i]}:{p + broker_config.REMOTING_PORT_OFFSET}"
                            if self.broker_ports else f"{self.host_of[i]}:{free_port(self.host_of[i])}"
                            for i, p in zip(self.ids, ports, strict=True)}
        self.namesrv_remoting_addresses = [] if self.external_namesrv else [
            f"127.0.0.1:{self.namesrv_port + 1}" if i == 0 and self.namesrv_port else f"127.0.0.1:{free_port()}"
            for i in range(len(self.namesrv_addresses))]
        # host:port of each process's metrics (GET /metrics), {} / [] with metrics off
        self.metrics_address_of = {i: f"{self.host_of[i]}:{free_port(self.host_of[i])}" for i in self.ids
                                   } if self.metrics else {}
        self.namesrv_metrics_addresses = [f"127.0.0.1:{free_port()}" for _ in self.namesrv_addresses
                                          ] if self.metrics and not self.external_namesrv else []
        self.namesrv_procs = [] if self.external_namesrv else [
            self._namesrv_proc(i, address) for i, address in enumerate(self.namesrv_addresses)]
        self.namesrv = self.namesrv_procs[0] if self.namesrv_procs else None  # the first one (None if external)
        self.brokers = {i: Proc(i, [sys.executable, "-m", "broker", "--config", self._write_config(i)],
                                os.path.join(self.base_dir, "logs", f"{self.group}-{i}.log")) for i in self.ids}
        self._channels: dict[str, grpc.Channel] = {}
        self.clocks: dict[str, ClockShift] = {}
        if self.clock_shifts:
            for i in self.ids:
                self.clocks[i] = ClockShift(os.path.join(self.base_dir, "conf", f"{i}.clockshift"))
                self.brokers[i].env_extra.update(self.clocks[i].env())

    def fixed_ports(self) -> dict[int, str]:
        """The ports this cluster listens on because a flag numbered them (namesrv_port, broker_ports), each with
        what listens there; {} when every port is drawn free."""
        named: dict[int, str] = {}
        if self.namesrv_port and not self.external_namesrv:
            named[self.namesrv_port] = "the NameServer's gRPC port (--namesrv-port)"
            named[self.namesrv_port + 1] = "the NameServer's Remoting door (--namesrv-port + 1)"
        for n, port in enumerate(self.broker_ports):
            replica = f"n{n}"
            named[port] = f"{replica}'s gRPC port (--broker-port + {n})"
            named[port + broker_config.REMOTING_PORT_OFFSET] = (
                f"{replica}'s Remoting door (--broker-port + {n + broker_config.REMOTING_PORT_OFFSET})")
        return named

    def ports_in_use(self) -> list[str]:
        """One line per fixed port (fixed_ports) that cannot be listened on now: which port, what it is for."""
        taken = []
        for port, what in self.fixed_ports().items():
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError as exc:
                    taken.append(f"port {port}, {what}: {exc.strerror or exc}")
        return taken

    def _namesrv_proc(self, i: int, address: str) -> Proc:
        name = "namesrv" if i == 0 else f"namesrv-{i}"
        metrics = ["--metricsListen", self.namesrv_metrics_addresses[i]] if self.namesrv_metrics_addresses else []
        remoting = ["--remotingListen", self.namesrv_remoting_addresses[i]]
        host, port = split_address(address)
        return Proc(name, [sys.executable, "-m", "namesrv", "--bindAddress", host, "--listenPort", str(port),
                           *remoting, *metrics, *self._namesrv_tls_args(), *self.namesrv_args],
                    os.path.join(self.base_dir, "logs", f"{name}.log"))

    def _namesrv_tls_args(self) -> list[str]:
        if self.certs is None:
            return []
        return ["--tlsMode", self.tls_mode, "--tlsCertFile", self.certs.cert_file, "--tlsKeyFile", self.certs.key_file,
                "--tlsCaFile", self.certs.ca_file, "--tlsClientAuth", self.tls_client_auth]

    @property
    def client_tls(self) -> tls.ClientTls:
        """How a client of this cluster connects (plaintext without tls_mode)."""
        if self.certs is None:
            return tls.PLAINTEXT
        if self.tls_client_auth == tls.CLIENT_AUTH_REQUIRE:
            return tls.ClientTls(True, self.certs.ca_file, self.certs.client_cert_file, self.certs.client_key_file)
        return tls.ClientTls(True, self.certs.ca_file)

    def _own_namesrv_addresses(self) -> list[str]:
        if self.namesrvs < 1:
            raise ValueError(f"namesrvs={self.namesrvs}: run at least one NameServer, or pass external_namesrv")
        first = f"127.0.0.1:{self.namesrv_port or free_port()}"
        return [first] + [f"127.0.0.1:{free_port()}" for _ in range(self.namesrvs - 1)]

    def config_of(self, replica_id: str) -> broker_config.BrokerConfig:
        settings = dict(
            brokerClusterName=self.cluster, brokerName=self.group, dLegerSelfId=replica_id,
            dLegerPeers=";".join(f"{i}-{self.raft_of[i]}" for i in self.peers_of.get(replica_id, self.ids)),
            namesrvAddr=";".join(self.namesrv_addresses),
            listenAddress=self.address_of[replica_id], storePathRootDir=os.path.join(self.base_dir, "store"),
            flushDiskType=self.flush, autoCreateTopicEnable=True, logLevel=self.log_level, metricsPort=0,
            remotingPort=int(self.remoting_of[replica_id].rpartition(":")[2]))
        if self.metrics:
            host, _, port = self.metrics_address_of[replica_id].rpartition(":")
            settings.update(metricsPort=int(port), metricsListenHost=host)
        if self.certs is not None:
            settings.update(tlsMode=self.tls_mode, tlsCertFile=self.certs.cert_file, tlsKeyFile=self.certs.key_file,
                            tlsCaFile=self.certs.ca_file, tlsClientAuth=self.tls_client_auth)
        if self._raft_password:
            settings.update(dLegerPassword=self._raft_password)
        settings.update(self.broker_settings)
        settings.setdefault("clusterSecret", self.cluster_secret)  # checked here; the processes get it from env
        return broker_config.load(None, settings, environ={})

    def _write_config(self, replica_id: str) -> str:
        path = os.path.join(self.base_dir, "conf", f"{self.group}-{replica_id}.toml")
        with open(path, "w") as f:
            f.write(broker_config.to_toml(dataclasses.replace(self.config_of(replica_id), clusterSecret="")))
        return path

    @property
    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env[parentwatch.ENV] = str(os.getpid())  # the servers stop if this process dies, even by SIGKILL
        env.pop(auth_internal.SECRET_FILE_ENV, None)  # the kit decides: its own secret, or none
        env.pop(auth_internal.SECRET_ENV, None)
        for name in (tls.MODE_ENV, tls.CERT_FILE_ENV, tls.KEY_FILE_ENV, tls.CA_FILE_ENV, tls.CLIENT_AUTH_ENV,
                     tls.CLIENT_TLS_ENV):  # the kit decides TLS too
            env.pop(name, None)
        if self.cluster_secret:
            env[auth_internal.SECRET_ENV] = self.cluster_secret
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        return env

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> DevCluster:
        start_all(self.namesrv_procs, self.env)  # first: a broker registers with every NameServer as it starts
        start_all([self.brokers[replica_id] for replica_id in self.ids], self.env)
        return self

    def start_replica(self, replica_id: str) -> None:
        self.brokers[replica_id].start(self.env)

    def kill(self, replica_id: str) -> None:
        self.brokers[replica_id].kill()

    def new_replica(self, replica_id: str, members: list[str], host: str = "127.0.0.1") -> str:
        """Configure (not start) one more replica of the group on an empty store at new addresses, its dLegerPeers
        the given members and itself (docs/operations.md, "Add, remove and replace a replica"). Returns its
        "id-host:raftport", what `rocketraft admin addReplica --replica` takes."""
        self.ids.append(replica_id)
        self.host_of[replica_id] = host
        self.address_of[replica_id] = f"{host}:{free_port(host)}"
        self.remoting_of[replica_id] = f"{host}:{free_port(host)}"
        self.raft_of[replica_id] = f"{host}:{free_port(host)}"
        if self.metrics:
            self.metrics_address_of[replica_id] = f"{host}:{free_port(host)}"
        self.peers_of[replica_id] = [*members, replica_id]
        self.brokers[replica_id] = Proc(replica_id, [sys.executable, "-m", "broker", "--config",
                                                     self._write_config(replica_id)],
                                        os.path.join(self.base_dir, "logs", f"{self.group}-{replica_id}.log"))
        return f"{replica_id}-{self.raft_of[replica_id]}"

    def reconfigure(self, *, cluster_secret: str | None = None, broker_settings: dict | None = None,
                    namesrv_args: tuple[str, ...] | None = None) -> None:
        """Change settings of a stopped cluster (as an operator edits its config files): the next start() runs every
        process with them, on the same addresses and stores."""
        if any(p.alive for p in [*self.brokers.values(), *self.namesrv_procs]):
            raise RuntimeError("reconfigure a stopped cluster: call stop() first")
        if cluster_secret is not None:
            self.cluster_secret = cluster_secret
        if broker_settings is not None:
            self.broker_settings = {**self.broker_settings, **broker_settings}
        if namesrv_args is not None:
            self.namesrv_args = namesrv_args
        for replica_id in self.ids:
            self._write_config(replica_id)  # the file each replica's command names
        if not self.external_namesrv:
            self.namesrv_procs = [self._namesrv_proc(i, a) for i, a in enumerate(self.namesrv_addresses)]
            self.namesrv = self.namesrv_procs[0]

    def kill_namesrv(self, i: int) -> None:
        """kill -9 this cluster's i-th NameServer (it forgets everything; brokers re-register on restart)."""
        self.namesrv_procs[i].kill()

    def start_namesrv(self, i: int) -> None:
        """Start the i-th NameServer again on its address; it knows the brokers after their next heartbeat."""
        self.namesrv_procs[i].start(self.env)

    def stop(self) -> None:
        stop_all(list(self.brokers.values()))
        stop_all(self.namesrv_procs)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> DevCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- inspection ------------------------------------------------------------------------------------------
    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = auth_internal.signed_channel(
                self.client_tls.channel(address, GRPC_OPTIONS), self.cluster_secret, audience=address)
        return self._channels[address]

    def replica_status(self, replica_id: str, timeout_s: float = 1.0) -> ipb.BrokerRegistration | None:
        if not self.brokers[replica_id].alive:
            return None
        stub = ipb_grpc.BrokerAdminStub(self.channel(self.address_of[replica_id]))
        try:
            return stub.Status(ipb.BrokerStatusRequest(), timeout=timeout_s).registration
        except grpc.RpcError:
            return None

    def statuses(self) -> dict[str, ipb.BrokerRegistration | None]:
        return {i: self.replica_status(i) for i in self.ids}

    def _namesrv_call(self, method: str, request, timeout_s: float):
        """Call a NameServer method on the first NameServer that answers (None if none does)."""
        for address in self.namesrv_addresses:
            try:
                return getattr(ipb_grpc.NameServerStub(self.channel(address)), method)(request, timeout=timeout_s)
            except grpc.RpcError:
                continue
        return None

    def master(self) -> str | None:
        """The replica the NameServers route writes to (None while there is none)."""
        info = self._namesrv_call("GetClusterInfo", ipb.GetClusterInfoRequest(), 1.0)
        for group in info.groups if info is not None else ():
            if group.group == self.group and group.master_replica_id:
                return group.master_replica_id
        return None

    def wait_master(self, timeout_s: float = 15.0, not_id: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            master = self.master()
            if master is not None and master != not_id:
                return master
            time.sleep(0.05)
        raise TimeoutError(f"no master (other than {not_id}) registered within {timeout_s}s; logs in "
                           f"{self.base_dir}/logs")

    def create_topic(self, name: str, queue_nums: int = 8, message_types: tuple[int, ...] = ()) -> None:
        """Create the topic on every group of this cluster, through a NameServer."""
        self._fan_out("CreateTopic", f"creating topic {name}", ipb.CreateTopicRequest(
            cluster=self.cluster, topic=ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6,
                                                        message_types=list(message_types))))

    def create_group(self, name: str, fifo: bool = False, max_delivery_attempts: int = 0) -> None:
        """Create the consumer group on every group of this cluster, through a NameServer."""
        self.wait_master()
        self._fan_out("CreateGroup", f"creating group {name}", ipb.CreateGroupRequest(
            cluster=self.cluster, group=ipb.GroupConfig(name=name, fifo=fifo,
                                                        max_delivery_attempts=max_delivery_attempts)))

    def delete_topic(self, name: str) -> None:
        """Delete the topic on every group of this cluster, through a NameServer."""
        self._fan_out("DeleteTopic", f"deleting topic {name}", ipb.DeleteTopicRequest(cluster=self.cluster, topic=name))

    def _fan_out(self, method: str, what: str, request, timeout_s: float = 15.0) -> None:
        """The change on every group, through a NameServer. A group that has no master right now (an election: on a
        loaded machine a group just started may elect twice) is asked again once it has one, as the refusal says,
        until timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            response = self._namesrv_call(method, request, 10)
            if response is None:
                raise RuntimeError(f"{what} failed: no NameServer answered ({', '.join(self.namesrv_addresses)})")
            failed = [r for r in response.results if not r.ok]
            electing = failed and all(r.code == Code.HA_NOT_AVAILABLE for r in failed)
            if not electing or time.monotonic() >= deadline:
                break
            self.wait_master(max(0.1, deadline - time.monotonic()))
        if failed or not response.results:
            raise RuntimeError(f"{what} failed: {failed or 'no group answered'}")

    def read_messages(self, topic: str, address: str | None = None) -> list[pb.Message]:
        """Every message of `topic` stored on one replica (the master by default), read with plain PullMessage
        calls in (queue, offset) order: what the group holds, independent of any client library."""
        if address is None:
            address = self.address_of[self.wait_master()]
        stub = svc_grpc.MessagingServiceStub(self.channel(address))
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)
        out: list[pb.Message] = []
        for queue_id in sorted({q.id for q in route.message_queues if is_master(q)}):
            offset = 0
            while True:
                queue = pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)
                responses = list(stub.PullMessage(svc.PullMessageRequest(
                    message_queue=queue, offset=offset, batch_size=64), timeout=5))
                messages = [r.message for r in responses if r.HasField("message")]
                next_offsets = [r.next_offset for r in responses if r.WhichOneof("content") == "next_offset"]
                out.extend(messages)
                # no progress: the end. An offset below the queue's first (deleted by retention) is answered
                # ILLEGAL_OFFSET with the first offset as next_offset: reading goes on from there.
                if not next_offsets or next_offsets[-1] <= offset:
                    break
                offset = next_offsets[-1]
        return out

    def interrupt_all(self) -> None:
        for proc in [*self.brokers.values(), *self.namesrv_procs]:
            proc.signal(signal.SIGTERM)
