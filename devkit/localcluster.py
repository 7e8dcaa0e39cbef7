"""A local dledger group of real replica processes on 127.0.0.x (demo, tests, benchmarks).

Each replica gets its own loopback address (127.0.0.11, .12, ...; 127.0.<slot>.11, ... in a parallel test worker,
devkit/workerslot.py) so a firewall rule can isolate one of them; all replicas use the same two ports (Raft,
control) on their own address.

Replicas run in sessions of their own (a terminal's Ctrl-C reaches only the parent, which stops them) and watch
their parent (serverkit/parentwatch.py): when the process that started them dies, even by SIGKILL, they stop
instead of holding their ports and stores.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from dledger import FlushPolicy, ReplicaConfig
from serverkit import parentwatch

from .control import KEY_ENV, ControlClient, new_key
from .logtail import log_tail
from .workerslot import loopback_host, port_range


@dataclass
class NodeSpec:
    node_id: str
    ip: str
    raft_port: int
    control_port: int
    data_dir: str

    @property
    def raft_address(self) -> str:
        return f"{self.ip}:{self.raft_port}"


LISTEN_PORT_MIN = 10_000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_handed_out: set[int] = set()  # ports this process already gave out: a probe's port is free again once closed


def free_port(ip: str) -> int:
    """A port to listen on, free on ip now, below the kernel's ephemeral range, in this test worker's share of
    that range (devkit/workerslot.py), and never one this process gave out before. A port from the ephemeral
    range (what binding port 0 gives) can be taken by any outgoing connection before the server binds it; and
    two probes in a row could return the same port, so one cluster could hand its broker's and its Raft's
    listener the same number. Both made clusters fail to start with
    "Address already in use" under load."""
    low, high = port_range(LISTEN_PORT_MIN, _ephemeral_low())
    for _ in range(200):
        port = random.randrange(low, high) if high > low + 100 else 0
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((ip, port))
            except OSError:
                continue
            port = probe.getsockname()[1]
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {ip} between {low} and {high}")


def reserve_ports(ports) -> None:
    """Ports this process will listen on by number (fixed by a flag or a default): free_port never hands them out,
    so a Raft or metrics port drawn afterwards cannot be one of them."""
    _handed_out.update(ports)


def free_port_block(ips: list[str], offsets: tuple[int, ...] = (0, 1)) -> int:
    """A port P such that P+o, for every o in offsets, is free on every one of ips now and was never handed out
    by this process; all of them are reserved (a server that listens on ports derived from one number: a
    replica's Raft and control ports, `rocketraft dev`'s brokers and their Remoting doors, a RocketMQ broker's
    fast-Remoting and HA ports)."""
    low, high = port_range(LISTEN_PORT_MIN, _ephemeral_low())
    span_fits = max(offsets) - min(offsets) < (high - low) // 2
    for _ in range(200):
        port = free_port(ips[0])
        wanted = [port + o for o in offsets]
        if not all(1024 < p < 65536 for p in wanted) or any(p in _handed_out for p in wanted if p != port):
            continue
        if span_fits and not all(low <= p < high for p in wanted):  # another worker's share
            continue
        try:
            for ip in ips:
                for p in wanted:
                    with socket.socket() as probe:
                        probe.bind((ip, p))
        except OSError:
            continue
        reserve_ports(wanted)
        return port
    raise RuntimeError(f"no free ports at offsets {offsets} on {ips} between {low} and {high}")


class LocalCluster:
    def __init__(self, base_dir: str, size: int = 3, first_ip: int = 11, group_id: str = "group-a",
                 flush_policy: FlushPolicy = FlushPolicy.SYNC_FLUSH, log_level: str = "INFO", **overrides):
        self.base_dir = base_dir
        self.group_id = group_id
        self.log_level = log_level
        ips = [loopback_host(first_ip + i) for i in range(size)]
        port = free_port_block(ips)
        self.nodes = {f"n{i + 1}": NodeSpec(f"n{i + 1}", ip, port, port + 1, os.path.join(base_dir, f"n{i + 1}"))
                      for i, ip in enumerate(ips)}
        self.peers = {n.node_id: n.raft_address for n in self.nodes.values()}
        self.flush_policy = flush_policy
        self.overrides = overrides
        self._procs: dict[str, subprocess.Popen] = {}
        self._clients: dict[str, ControlClient] = {}
        self.control_key = new_key()  # one random key per cluster, given to its replicas in their environment

    # -- processes ------------------------------------------------------------------------------------
    def config_for(self, node_id: str) -> ReplicaConfig:
        spec = self.nodes[node_id]
        return ReplicaConfig(group_id=self.group_id, self_id=node_id, peers=self.peers, data_dir=spec.data_dir,
                             flush_policy=self.flush_policy, **self.overrides)

    def start(self) -> LocalCluster:
        """Start every replica and wait until each answers. If one does not, the ones that did are stopped before
        the error goes up: a caller cannot stop a cluster whose start() raised."""
        try:
            for node_id in self.nodes:  # side by side: each spends most of its start importing
                self._spawn(node_id)
            for node_id in self.nodes:
                self.client(node_id, wait_s=30)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node_id: str) -> None:
        self._spawn(node_id)
        self.client(node_id, wait_s=30)

    def _spawn(self, node_id: str) -> None:
        spec = self.nodes[node_id]
        os.makedirs(spec.data_dir, exist_ok=True)
        raw = asdict(self.config_for(node_id))
        raw["flush_policy"] = raw["flush_policy"].value
        config_path = os.path.join(spec.data_dir, "replica.json")
        with open(config_path, "w") as f:
            json.dump(raw, f, indent=2)
        log = open(os.path.join(spec.data_dir, "node.log"), "ab")
        self._procs[node_id] = subprocess.Popen(
            [sys.executable, "-m", "devkit.node", "--config", config_path,
             "--control", f"{spec.ip}:{spec.control_port}", "--log-level", self.log_level],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, KEY_ENV: self.control_key, parentwatch.ENV: str(os.getpid())})
        log.close()
        self._drop_client(node_id)

    def is_running(self, node_id: str) -> bool:
        proc = self._procs.get(node_id)
        return proc is not None and proc.poll() is None

    def pid(self, node_id: str) -> int:
        return self._procs[node_id].pid

    def kill(self, node_id: str) -> None:
        self._procs[node_id].send_signal(signal.SIGKILL)
        self._procs[node_id].wait(10)
        self._drop_client(node_id)

    def stop_node(self, node_id: str, timeout_s: float = 15) -> None:
        if not self.is_running(node_id):
            return
        self._procs[node_id].send_signal(signal.SIGCONT)
        self._procs[node_id].terminate()
        self._reap(node_id, timeout_s)

    def _reap(self, node_id: str, timeout_s: float) -> None:
        """Wait for a replica told to stop; kill -9 it after timeout_s."""
        proc = self._procs[node_id]
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        self._drop_client(node_id)

    def stop(self, timeout_s: float = 15) -> None:
        """SIGTERM every running replica at once, then wait for each (kill -9 after timeout_s)."""
        running = [node_id for node_id in self.nodes if self.is_running(node_id)]
        for node_id in running:
            self._procs[node_id].send_signal(signal.SIGCONT)
            self._procs[node_id].terminate()
        deadline = time.monotonic() + timeout_s
        for node_id in running:
            self._reap(node_id, max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _drop_client(self, node_id: str) -> None:
        client = self._clients.pop(node_id, None)
        if client is not None:
            client.close()

    # -- talking to replicas ----------------------------------------------------------------------------
    def client(self, node_id: str, wait_s: float = 5) -> ControlClient:
        client = self._clients.get(node_id)
        if client is not None:
            return client
        spec = self.nodes[node_id]
        deadline = time.monotonic() + wait_s
        while True:
            try:
                client = ControlClient((spec.ip, spec.control_port), self.control_key.encode())
                break
            except OSError:
                if time.monotonic() > deadline or not self.is_running(node_id):
                    raise RuntimeError(f"replica {node_id} is not answering on {spec.ip}:{spec.control_port}; "
                                       f"the end of {spec.data_dir}/node.log:\n"
                                       f"{log_tail(os.path.join(spec.data_dir, 'node.log'))}") from None
                time.sleep(0.05)
        self._clients[node_id] = client
        return client

    def store_dir(self, node_id: str) -> str:
        """The replica's LMDB environment (what devkit.storefault works on while the replica is stopped)."""
        return os.path.join(self.nodes[node_id].data_dir, "store")

    def node_log(self, node_id: str) -> str:
        with open(os.path.join(self.nodes[node_id].data_dir, "node.log"), errors="replace") as f:
            return f.read()

    def status(self, node_id: str) -> dict | None:
        if not self.is_running(node_id):
            return None
        try:
            return self.client(node_id).call("status", timeout_s=2)
        except Exception:  # noqa: BLE001 - a paused or dying replica simply has no status
            return None

    def statuses(self) -> dict[str, dict | None]:
        return {node_id: self.status(node_id) for node_id in self.nodes}

    def leader(self, among: list[str] | None = None) -> str | None:
        for node_id in among or list(self.nodes):
            st = self.status(node_id)
            if st and st["role"] == "LEADER":
                return node_id
        return None

    def wait_leader(self, timeout_s: float = 15, among: list[str] | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader(among)
            if leader:
                return leader
            time.sleep(0.02)
        raise TimeoutError(f"no leader among {among or list(self.nodes)} within {timeout_s}s: {self.statuses()}")

    def wait_settled_leader(self, timeout_s: float = 15) -> str:
        """The leader, once every running replica is connected to every other and names it (a group just started
        may still change leaders while its connections come up; an append made then can fail as not appended)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [n for n in self.nodes if self.is_running(n)]
            sts = {n: self.status(n) for n in running}
            leaders = {st["leader_id"] if st else None for st in sts.values()}
            connected = all(st and set(st["connected_peers"]) >= set(running) - {n} for n, st in sts.items())
            if connected and len(leaders) == 1 and (leader := leaders.pop()) and sts[leader]["role"] == "LEADER":
                return leader
            time.sleep(0.02)
        raise TimeoutError(f"no settled leader within {timeout_s}s: {self.statuses()}")

    def wait_connected(self, timeout_s: float = 15) -> None:
        """Until every running replica is connected to every other running replica."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [n for n in self.nodes if self.is_running(n)]
            sts = {n: self.status(n) for n in running}
            if all(st and set(st["connected_peers"]) >= set(running) - {n} for n, st in sts.items()):
                return
            time.sleep(0.02)
        raise TimeoutError(f"replicas not fully connected within {timeout_s}s: {self.statuses()}")

    def wait_applied(self, index: int, nodes: list[str] | None = None, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        nodes = nodes or list(self.nodes)
        while time.monotonic() < deadline:
            sts = [self.status(n) for n in nodes]
            if all(st and st["applied_index"] >= index for st in sts):
                return
            time.sleep(0.05)
        raise TimeoutError(f"not all of {nodes} applied index {index} within {timeout_s}s: {self.statuses()}")

    def append(self, node_id: str, payloads: list[bytes], timeout_s: float = 10) -> dict:
        return self.client(node_id).call("append", timeout_s=timeout_s, payloads=payloads)
