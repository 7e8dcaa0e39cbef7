"""Apache RocketMQ itself as a local reference cluster (issue 33): the behaviour rocketraft is compared with.

Real JVMs from RocketMQ's own Maven Central jars (tests/reference/pom.xml; `bash scripts/setup.sh --tests` copies
them into tests/reference/target/lib), each `java -cp 'lib/*' <main class>` in a temp dir, on free 127.0.0.1 ports:
one NameServer, one broker group of three brokers whose CommitLog is DLedger (Raft: the leader is the master, the
others slaves), and a proxy in cluster mode, the access point of the RocketMQ 5 gRPC SDKs.

    with ReferenceCluster() as ref:            # started, master elected and registered, proxy answering
        ref.create_topic("orders", message_type="FIFO")
        ref.create_group("order-readers", fifo=True)
        ref.proxy_grpc_endpoint                # "127.0.0.1:P", for the official SDKs
        ref.namesrv_addr                       # "127.0.0.1:N", Remoting, for RocketMQ's own tools and clients
        ref.master().process.kill()            # kill -9 of the master: DLedger elects another

Every process logs into its own folder under base_dir (RocketMQ writes to ~/logs/rocketmqlogs; each JVM's user.home
is pointed there); the temp dir is removed on a clean stop and kept, with its path printed, when the start or a
caller's block failed. `python -m devkit.reference` starts one and waits for Ctrl-C.

Topic auto-creation: RocketMQ's broker creates a topic at a Remoting client's first send by default
(autoCreateTopicEnable=true in BrokerConfig, and so here); its recommended production setup turns it off, and so does
`ReferenceCluster(auto_create_topic=False)`. The same for subscription groups (autoCreateSubscriptionGroup). Through
the proxy (the gRPC SDKs) no send creates a topic either way: a producer of a topic no one created fails at start
with NOT_FOUND "CODE: 17  DESC: No topic route info in name server for the topic: T" (tests/reference).

Everything else is RocketMQ's default except the files' sizes and a few threads (STORE_SETTINGS); broker_settings
and proxy_settings change any key, e.g. the proxy's 5 s minimum long polling or its 20 s route refresh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request

from .localcluster import free_port, free_port_block
from .logtail import log_tail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_DIR = os.path.join(ROOT, "tests", "reference")
LIB_DIR = os.path.join(REFERENCE_DIR, "target", "lib")
CLASSES_DIR = os.path.join(REFERENCE_DIR, "target", "classes")
HOST = "127.0.0.1"
CLUSTER = "RefCluster"
BROKER_NAME = "RefBroker"
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
MISSING = ("Apache RocketMQ's jars are not installed: run `mvn -q -B package` in tests/reference "
           "(scripts/setup.sh --tests does; it needs Maven and Java 17)")

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
PROXY_MAIN = "org.apache.rocketmq.proxy.ProxyStartup"
ADMIN_BATCH_MAIN = "rocketraft.reference.AdminBatch"  # ours (tests/reference/src): MQAdminStartup, many commands

# Small JVMs for a 2-core machine: RocketMQ's scripts ask for 4-8 GiB heaps and G1; a serial GC and a small heap
# keep each process at a few hundred MiB. C1 only (TieredStopAtLevel=1) starts the short-lived ones faster; not
# the brokers, whose timer wheel compares its 38 MB file byte by byte at every flush.
JVM_OPTIONS = ("-Xss512k", "-XX:+UseSerialGC", "-XX:-OmitStackTraceInFastThrow", "-XX:MaxDirectMemorySize=128m",
               "-Djava.net.preferIPv4Stack=true")
C1_ONLY = "-XX:TieredStopAtLevel=1"
HEAP = {"namesrv": ("-Xmx96m", C1_ONLY), "broker": ("-Xmx256m",), "proxy": ("-Xmx192m", C1_ONLY),
        "admin": ("-Xmx64m", C1_ONLY)}
# The brokers' files, small: a 1 GiB CommitLog (DLedger entry) file and 6 MB ConsumeQueue files by default.
STORE_SETTINGS = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,   # above maxMessageSize (4 MiB) with room to spare
    "mappedFileSizeConsumeQueue": 30_000 * 20,     # 20-byte units
    "mappedFileSizeTimerLog": 16 * 1024 * 1024,
    "sendMessageThreadPoolNums": 4,
    "timerFlushIntervalMs": 10_000,                # a pass over the timer wheel's 38 MB file: 1 s by default
}
START_TIMEOUT_S = 120.0
ADMIN_TIMEOUT_S = 60.0


def available() -> bool:
    """Whether setup installed RocketMQ's jars (and built AdminBatch) and a `java` is on PATH."""
    return (shutil.which("java") is not None and version() is not None
            and os.path.isfile(os.path.join(CLASSES_DIR, *ADMIN_BATCH_MAIN.split(".")) + ".class"))


def version() -> str | None:
    """RocketMQ's version the jars are, e.g. "5.3.3"."""
    if not os.path.isdir(LIB_DIR):
        return None
    for name in os.listdir(LIB_DIR):
        m = re.fullmatch(r"rocketmq-broker-(.+)\.jar", name)
        if m:
            return m.group(1)
    return None


def _properties(path: str, settings: dict) -> None:
    def text(v):
        return str(v).lower() if isinstance(v, bool) else str(v)

    with open(path, "w") as f:
        f.writelines(f"{k}={text(v)}\n" for k, v in settings.items())


@dataclass
class JavaProc:
    """One JVM of the reference: its folder (user.home, logs/rocketmqlogs/ inside) and console log."""
    name: str
    main: str
    args: list[str]
    home: str
    heap: tuple[str, ...]
    process: subprocess.Popen | None = None
    extra: dict = field(default_factory=dict)   # what it serves, e.g. {"address": "127.0.0.1:P"}

    @property
    def console(self) -> str:
        return os.path.join(self.home, "console.log")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.home, "logs", "rocketmqlogs")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        os.makedirs(self.home, exist_ok=True)
        with open(self.console, "ab") as out:
            self.process = subprocess.Popen(
                java_command(self.main, self.home, self.heap, *self.args), cwd=self.home, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, env=java_env(self.home), start_new_session=True)

    def printed(self, text: str) -> bool:
        try:
            with open(self.console, errors="replace") as f:
                return text in f.read()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.alive:
            self.process.kill()
            self.process.wait()

    def describe(self) -> str:
        code = "running" if self.alive else f"exit code {self.process.returncode if self.process else None}"
        return f"{self.name} ({code}); the end of {self.console}:\n{log_tail(self.console)}"


def java_env(home: str) -> dict:
    return {**os.environ, "ROCKETMQ_HOME": home}


def java_command(main: str, home: str, heap: tuple[str, ...], *args: str) -> list[str]:
    return ["java", *heap, *JVM_OPTIONS, f"-Duser.home={home}", f"-Drocketmq.home.dir={home}",
            "-cp", f"{CLASSES_DIR}{os.pathsep}{os.path.join(LIB_DIR, '*')}", main, *args]


def remoting_call(address: str, code: int, ext: dict | None = None, timeout_s: float = 3.0) -> tuple[dict, bytes]:
    """One Remoting request (rocketraft.remoting.frame, the one codec of the project): ({code, remark, extFields}
    of the answer, its body)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(frame.encode(frame.Command(code=code, opaque=1, ext=ext or {})))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"{address} closed the connection")
            data += chunk
    answer = frame.decode(data[4:])
    return {"code": answer.code, "remark": answer.remark, "extFields": answer.ext}, answer.body


def _fastjson(body: bytes) -> dict:
    """RocketMQ's fastjson writes a map's integer keys unquoted ({0:"addr"}): quote them for json."""
    return json.loads(re.sub(rb'([{,])(-?\d+):', rb'\1"\2":', body))


def cluster_info(namesrv_addr: str) -> dict:
    """The NameServer's brokerAddrTable: {brokerName: {brokerId: address}} (id 0 is the master)."""
    header, body = remoting_call(namesrv_addr, Request.GET_BROKER_CLUSTER_INFO)
    if header.get("code") != 0:
        raise RuntimeError(f"GET_BROKER_CLUSTER_INFO: {header}")
    table = _fastjson(body).get("brokerAddrTable", {})
    return {name: {int(k): v for k, v in data.get("brokerAddrs", {}).items()} for name, data in table.items()}


class ReferenceCluster:
    """Apache RocketMQ: NameServer, a DLedger group of `brokers` brokers (one brokerName), a cluster-mode proxy.

    broker_settings / proxy_settings add to or override what each broker's .conf / the proxy's rmq-proxy.json get
    (RocketMQ's own keys, e.g. {"transactionCheckInterval": 1000} / {"topicRouteServiceCacheRefreshSeconds": 1})."""

    def __init__(self, base_dir: str | None = None, brokers: int = 3, auto_create_topic: bool = True,
                 auto_create_group: bool = True, broker_settings: dict | None = None,
                 proxy_settings: dict | None = None, keep_dir: bool = False):
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="rocketmq-reference-")
        self.keep_dir = keep_dir
        self.auto_create_topic = auto_create_topic
        self.auto_create_group = auto_create_group
        self.broker_settings = dict(broker_settings or {})
        self.proxy_settings = dict(proxy_settings or {})
        self.brokers: list[JavaProc] = []
        self.namesrv: JavaProc | None = None
        self.proxy: JavaProc | None = None
        self.namesrv_addr = ""
        self.proxy_grpc_endpoint = ""
        self.proxy_remoting_addr = ""
        self.cluster_name = CLUSTER
        self.broker_name = BROKER_NAME
        self.start_seconds: float | None = None
        self._size = brokers
        self._failed = False
        self._told = False
        self._admin: subprocess.Popen | None = None
        self._admin_lock = threading.Lock()

    # -- start and stop --------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ReferenceCluster:
        if not available():
            raise RuntimeError(MISSING)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            self._start_namesrv(deadline)
            self._start_brokers()
            # the proxy creates its system topics on the cluster as it starts: it needs the master registered
            self.wait_master(deadline - time.monotonic(), replicas=self._size)
            self._start_proxy(deadline)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start_namesrv(self, deadline: float) -> None:
        port = free_port(HOST)
        home = os.path.join(self.base_dir, "namesrv")
        os.makedirs(home, exist_ok=True)
        conf = os.path.join(home, "namesrv.conf")
        _properties(conf, {"listenPort": port, "rocketmqHome": home})
        self.namesrv = JavaProc("namesrv", NAMESRV_MAIN, ["-c", conf], home, HEAP["namesrv"])
        self.namesrv_addr = f"{HOST}:{port}"
        self.namesrv.start()
        self._wait(lambda: self._answers(self.namesrv_addr), deadline, "the NameServer answering", [self.namesrv])

    def _start_brokers(self) -> None:
        # a broker also listens on P-2 (its "fast" Remoting channel) and keeps P+1 for its HA port
        listen = [free_port_block([HOST], (-2, 0, 1)) for _ in range(self._size)]
        dledger = [free_port(HOST) for _ in range(self._size)]
        peers = ";".join(f"n{i}-{HOST}:{p}" for i, p in enumerate(dledger))
        for i in range(self._size):
            home = os.path.join(self.base_dir, f"broker-n{i}")
            store = os.path.join(home, "store")
            os.makedirs(home, exist_ok=True)
            conf = os.path.join(home, "broker.conf")
            _properties(conf, {
                "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerIP1": HOST, "listenPort": listen[i],
                "namesrvAddr": self.namesrv_addr, "rocketmqHome": home,
                "storePathRootDir": store, "storePathCommitLog": os.path.join(store, "commitlog"),
                "enableDLegerCommitLog": True, "dLegerGroup": BROKER_NAME, "dLegerPeers": peers,
                "dLegerSelfId": f"n{i}",
                "autoCreateTopicEnable": self.auto_create_topic,
                "autoCreateSubscriptionGroup": self.auto_create_group,
                **STORE_SETTINGS, **self.broker_settings})
            proc = JavaProc(f"broker-n{i}", BROKER_MAIN, ["-c", conf], home, HEAP["broker"],
                            extra={"address": f"{HOST}:{listen[i]}", "dledger_address": f"{HOST}:{dledger[i]}",
                                   "self_id": f"n{i}"})
            self.brokers.append(proc)
            proc.start()

    def _start_proxy(self, deadline: float) -> None:
        grpc_port, remoting_port = free_port(HOST), free_port(HOST)
        home = os.path.join(self.base_dir, "proxy")
        os.makedirs(home, exist_ok=True)
        conf = os.path.join(home, "rmq-proxy.json")
        with open(conf, "w") as f:
            json.dump({"rocketMQClusterName": CLUSTER, "proxyMode": "cluster", "proxyName": "reference-proxy",
                       "namesrvAddr": self.namesrv_addr, "grpcServerPort": grpc_port,
                       "remotingListenPort": remoting_port, **self.proxy_settings}, f, indent=1)
        self.proxy = JavaProc("proxy", PROXY_MAIN, ["-pc", conf], home, HEAP["proxy"])
        self.proxy_grpc_endpoint = f"{HOST}:{grpc_port}"
        self.proxy_remoting_addr = f"{HOST}:{remoting_port}"
        self.proxy.start()
        self._wait(lambda: self.proxy.printed("rocketmq-proxy startup successfully"), deadline,
                   "the proxy's start", [self.proxy])
        self._wait(lambda: self._answers(self.proxy_grpc_endpoint), deadline, "the proxy's gRPC port", [self.proxy])

    def stop(self, timeout_s: float = 3.0) -> None:
        """SIGTERM to every JVM (RocketMQ's shutdown hooks run), SIGKILL to one still running after timeout_s (the
        brokers' hooks take 10 s and more; nothing here is kept for a restart). The
        temp dir goes unless a start failed or keep_dir: then its path is printed."""
        procs = [p.process for p in (self.proxy, *self.brokers, self.namesrv) if p is not None and p.alive]
        if self._admin is not None and self._admin.poll() is None:
            procs.append(self._admin)
        for p in procs:
            p.terminate()
        end = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._admin is not None:
            self._admin.stdin.close()
        if self._own_dir and not (self._failed or self.keep_dir):
            shutil.rmtree(self.base_dir, ignore_errors=True)
        elif self._failed and not self._told:
            self._told = True
            print(f"the reference's logs: {self.base_dir}", file=sys.stderr)

    def __enter__(self) -> ReferenceCluster:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._failed = True
        self.stop()

    # -- state ------------------------------------------------------------------------------------------------------

    def routes(self) -> dict[int, str]:
        """{brokerId: Remoting address} of the group as the NameServer has it: id 0 is the master."""
        return cluster_info(self.namesrv_addr).get(BROKER_NAME, {})

    def master(self) -> JavaProc | None:
        """The broker the NameServer names master, or None."""
        try:
            address = self.routes().get(0)
        except OSError:
            return None
        return next((b for b in self.brokers if b.extra["address"] == address and b.alive), None)

    def broker_addresses(self) -> list[str]:
        return [b.extra["address"] for b in self.brokers]

    def wait_master(self, timeout_s: float = 60.0, replicas: int = 1, other_than: JavaProc | None = None) -> JavaProc:
        """The master, once the NameServer has one registered (and `replicas` brokers of the group in all), alive
        and not `other_than` (the one just killed)."""
        def ready():
            try:
                routes = self.routes()
            except OSError:
                return None
            m = self.master()
            return m if m is not None and m is not other_than and len(routes) >= replicas else None

        return self._wait(ready, time.monotonic() + timeout_s, "a master registered with the NameServer",
                          [b for b in self.brokers if b is not other_than])

    def _wait(self, predicate, deadline: float, what: str, procs: list[JavaProc]):
        while True:
            value = predicate()
            if value:
                return value
            dead = [p for p in procs if not p.alive]
            if dead or time.monotonic() > deadline:
                why = "exited" if dead else "timed out"
                raise RuntimeError(f"the reference {why} waiting for {what}; logs in {self.base_dir}\n"
                                   + "\n".join(p.describe() for p in (dead or procs)))
            time.sleep(0.3)

    @staticmethod
    def _answers(address: str) -> bool:
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False

    # -- admin (RocketMQ's own mqadmin) -------------------------------------------------------------------------------

    def admin(self, *args: str, timeout_s: float = ADMIN_TIMEOUT_S) -> str:
        """`mqadmin <args> -n <this NameServer>`: what it printed. One JVM (tests/reference's AdminBatch, started at
        the first call) runs every command of this cluster. mqadmin reports a failure by printing it, not by an exit
        code: a caller checks the text (create_topic and create_group do)."""
        with self._admin_lock:
            if self._admin is None or self._admin.poll() is not None:
                home = os.path.join(self.base_dir, "admin")
                os.makedirs(home, exist_ok=True)
                with open(os.path.join(home, "console.log"), "ab") as log:
                    self._admin = subprocess.Popen(
                        java_command(ADMIN_BATCH_MAIN, home, HEAP["admin"]), cwd=home, env=java_env(home),
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
            self._admin.stdin.write(json.dumps([*args, "-n", self.namesrv_addr]) + "\n")
            self._admin.stdin.flush()
            ready, _, _ = select.select([self._admin.stdout], [], [], timeout_s)
            line = self._admin.stdout.readline() if ready else ""
            if not line:
                self._admin.kill()
                self._admin.wait()
                raise RuntimeError(f"mqadmin {' '.join(args)}: no answer within {timeout_s:.0f}s (exit code "
                                   f"{self._admin.returncode}; {os.path.join(self.base_dir, 'admin')})")
            return json.loads(line)["output"]

    def _admin_update(self, *args: str) -> None:
        out = self.admin(*args)
        if "success" not in out or "[error]" in out or "Exception" in out:
            raise RuntimeError(f"mqadmin {' '.join(args)} failed:\n{out}")

    def create_topic(self, name: str, message_type: str = "NORMAL", queues: int = 8) -> None:
        """The topic on every broker of the group, slaves too: RocketMQ's DLedger brokers copy the master's topic
        configs to slaves only every 10 s, so a master killed sooner left a new master without the topic (every send
        then failed with NotFoundException: the one failure of a CI run)."""
        if message_type not in MESSAGE_TYPES:
            raise ValueError(f"message_type {message_type!r}: one of {MESSAGE_TYPES}")
        for address in self.broker_addresses():
            self._admin_update("updateTopic", "-b", address, "-t", name, "-r", str(queues), "-w", str(queues),
                               "-a", f"+message.type={message_type}")

    def create_group(self, name: str, fifo: bool = False) -> None:
        """The group on every broker, as create_topic."""
        for address in self.broker_addresses():
            self._admin_update("updateSubGroup", "-b", address, "-g", name, *(("-o", "true") if fifo else ()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.reference",
                                     description="Start Apache RocketMQ (NameServer, 3 DLedger brokers, proxy) "
                                                 "from tests/reference/target/lib; Ctrl-C stops it.")
    parser.add_argument("--dir", help="keep data and logs here (default: a temp dir, removed at stop)")
    parser.add_argument("--no-auto-create-topic", action="store_true",
                        help="autoCreateTopicEnable=false (RocketMQ's recommended production setting)")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME[:TYPE]",
                        help="create this topic (TYPE: NORMAL, FIFO, DELAY, TRANSACTION); repeatable")
    args = parser.parse_args(argv)

    def interrupt(signum, frame):  # SIGTERM too, and SIGINT where a background start ignored it
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    if not available():
        sys.exit(MISSING)
    ref = ReferenceCluster(args.dir, auto_create_topic=not args.no_auto_create_topic)
    print(f"starting Apache RocketMQ {version()} in {ref.base_dir} ...", flush=True)
    with ref:
        for spec in args.topic:
            name, _, kind = spec.partition(":")
            ref.create_topic(name, kind.upper() or "NORMAL")
        print(f"ready in {ref.start_seconds:.1f}s\n"
              f"  proxy gRPC (RocketMQ 5 SDKs): {ref.proxy_grpc_endpoint}\n"
              f"  proxy Remoting:               {ref.proxy_remoting_addr}\n"
              f"  NameServer (Remoting):        {ref.namesrv_addr}\n"
              + "".join(f"  {b.name}: {b.extra['address']} (pid {b.process.pid})"
                        f"{'  master' if b is ref.master() else ''}\n" for b in ref.brokers)
              + f"  logs: {ref.base_dir}/*/logs/rocketmqlogs\nCtrl-C stops it.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            print("stopping ...", flush=True)


if __name__ == "__main__":
    main()
