"""The nemesis: faults injected into a running ChaosCluster, one family per class.

Every `inject` returns an ActiveFault whose `heal()` undoes exactly what it did; the schedule (runner.py) heals
every fault of a cycle together, and `ChaosCluster.heal_everything()` undoes whatever could still be in place
when a run ends early. Families:

  kill       kill -9 a replica (the master half the time), restart it when healed
  pause      SIGSTOP a replica (the master half the time), SIGCONT when healed
  partition  isolate the master | a random minority from the majority | bridge (one node sees both sides) |
             majorities ring (5+ replicas: every node sees a majority, no two the same)
  netem      random packet loss on one replica's traffic (nftables), plus delay where tc netem works
  disk       fill one replica's own filesystem (a tmpfs per replica) to 97 %, free it when healed

  transfer   ask the master to hand leadership to a random live follower (BrokerAdmin.TransferLeader, what
             `rocketraft admin transferLeader --to` does); nothing to heal
  rolling    a rolling restart: a clean stop (SIGTERM) of each replica in turn, followers first and the master
             last (its stop hands leadership over), each restarted and caught up before the next one stops
  membership replace an old follower with a fresh replica: start one on an empty store at a new address, add it
             (BrokerAdmin.AddReplica, what `rocketraft admin addReplica` does), wait until it votes, remove the old
             follower (RemoveReplica) and stop it; every cycle replaces one more

kill -9 at each step of a membership change or a leadership transfer (jepsen_tests/memberkill.py; not in 'all';
`family:step` names one step, the family alone picks one per fault):

  addkill      add a fresh replica; kill the master once it stored the add, or the new replica mid catch-up, or
               the new replica once promoted
  removekill   remove a follower from the group of 3; kill the master, or the follower, once the master stored it
  replacekill  add, promote, remove an old follower; kill the master at 4 voters, the master or the old follower
               once the removal is stored, or the new replica once it is done
  transferkill kill the target, or the master, once the master hands leadership over

Clock families (not in 'all'; they need a cluster whose replicas run with shiftable clocks, devkit/clockshift.py,
which the runner starts when one is chosen; run them with retention on, --retention-s, and --expose-retention, so
that what was sent while a clock was wrong heads every queue, where retention looks first):

  clockskew   shift one replica's wall clock (the master half the time) 3 days ahead; back when healed
  clockstep   step the master's clock 3 days ahead (an NTP step) while it leads; back when healed
  clockbehind set a follower's clock 3 days behind and make it master (TransferLeader); healed by moving
              mastership to another replica, then setting the clock right

Storage families (not in 'all': two of them at once can take a majority of the group's disks, which the group
rightly refuses to recover from without an operator; see jepsen_tests/README.md):

  lostdisk   SIGSTOP a follower, let the others acknowledge for a moment, kill -9 a second replica (the master
             half the time), move its data directory aside and restart it on an empty store; SIGCONT when healed
  bitflip    kill -9 a minority replica, flip a bit in a few stored entries that hold sends, restart it; healed
             by reading those messages on it (QueryMessage), which makes it find and repair the entries
  torn       kill -9 a minority replica, cut its data.mdb short, restart it: it must refuse the store; healed
             by moving the torn store aside and restarting it on an empty one (replacing the disk)
  garbage    kill -9 a minority replica, write random bytes (or, half the time, a copy of a branch page: a misdirected
             write) over the B-tree leaf pages that hold a random applied entry, restart it: it must refuse the
             store (the open walks every page of the tree in a child process); healed like torn
  crash      kill -9 every replica, give each store.open marker another boot id (a machine crash, as the
             replica sees it), restart them all; healed by restarting any that is still down
  replace    stop a follower cleanly, move its data directory aside, restart it on an empty store; healed when
             it votes again (or at the end of the fault, whichever is first)
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import lmdb

from devkit import storefault
from dledger import logformat
from rocketraft.client.config import ClientConfig
from rocketraft.protocol.wire import Code, ipb, ipb_grpc

from . import netfault
from .cluster import ChaosCluster

log = logging.getLogger(__name__)

BASIC = ("kill", "pause", "partition", "netem", "disk")  # 'all'
OPERATIONS = ("transfer", "rolling", "membership")  # what operators do to a live group
CLOCKS = ("clockskew", "clockstep", "clockbehind")  # one replica's wall clock wrong (need clock shifts)
STORAGE = ("lostdisk", "bitflip", "torn", "garbage", "crash", "replace")
MEMBERSHIP_KILLS = ("addkill", "removekill", "replacekill", "transferkill")  # memberkill.py; 'family:step' too
FAMILIES = BASIC + OPERATIONS + STORAGE + CLOCKS + MEMBERSHIP_KILLS
CLOCK_OFFSET_S = 3 * 86_400.0  # the field's case: three days
DISK_FILL_PERCENT = 97.0
LAG_S = 1.0  # lostdisk: how long the others go on acknowledging while one follower is paused
FLIPPED_ENTRIES_MAX = 3
SEND_ID = re.compile(rb"p\d+-\d+")  # the workloads' message ids (body and key of every send)
VOTER_WAIT_S = 30.0  # a new fault that needs every replica voting waits at most this long for a catching-up one
REPAIR_WAIT_S = 15.0


@dataclass
class ActiveFault:
    family: str
    description: str
    targets: list[str]
    undo: list = field(default_factory=list, repr=False)  # callables, run in reverse order
    leaderless_s: float | None = None  # a kill's: until the NameServer named a running master again (memberkill.py)

    def heal(self) -> None:
        for step in reversed(self.undo):
            step()
        self.undo.clear()


def _target(cluster: ChaosCluster, rng: random.Random, live_only: bool = True) -> tuple[str, str]:
    """(replica, why): the master half the time (faults that hit the master are the interesting ones)."""
    master = cluster.master_id()
    candidates = [r for r in cluster.ids if cluster.alive(r)] if live_only else list(cluster.ids)
    if master in candidates and rng.random() < 0.5:
        return master, "the master"
    choice = rng.choice(candidates or list(cluster.ids))
    return choice, "the master" if choice == master else "a follower"


class Kill:
    family = "kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng)
        cluster.kill(replica)
        return ActiveFault(self.family, f"kill -9 {replica} ({role})", [replica],
                           [lambda: cluster.restart(replica)])


class Pause:
    family = "pause"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng)
        cluster.signal(replica, signal.SIGSTOP)
        return ActiveFault(self.family, f"SIGSTOP {replica} ({role})", [replica],
                           [lambda: cluster.signal(replica, signal.SIGCONT)])


class Partition:
    family = "partition"
    KINDS = ("isolate-master", "minority", "bridge", "ring")

    def inject(self, cluster: ChaosCluster, rng: random.Random, kind: str | None = None) -> ActiveFault:
        ids = list(cluster.ids)
        kind = kind or rng.choice([k for k in self.KINDS if k != "ring" or len(ids) >= 5])
        cuts, what, targets = partition_shape(kind, ids, cluster.master_id(), rng)
        for a, b in cuts:
            netfault.cut([cluster.host_of[r] for r in a], [cluster.host_of[r] for r in b])
        return ActiveFault(self.family, what, targets, [netfault.heal])


def partition_shape(kind: str, ids: list[str], master: str | None,
                    rng: random.Random) -> tuple[list[tuple[list[str], list[str]]], str, list[str]]:
    """(cuts as (side, side) pairs, description, the replicas cut off) for one kind of partition."""
    ids = list(ids)
    rng.shuffle(ids)
    if kind == "isolate-master":
        master = master if master in ids else ids[0]
        rest = sorted(r for r in ids if r != master)
        return [([master], rest)], f"isolate the master {master} from {', '.join(rest)}", [master]
    if kind == "minority":
        minority, majority = sorted(ids[:(len(ids) - 1) // 2]), sorted(ids[(len(ids) - 1) // 2:])
        return [(minority, majority)], f"partition {minority} | {majority}", minority
    if kind == "bridge":
        half = len(ids) // 2
        left, bridge, right = sorted(ids[:half]), ids[half], sorted(ids[half + 1:])
        return [(left, right)], f"bridge: {left} and {right} see only {bridge}", left + right
    if kind == "ring":
        if len(ids) < 5:
            raise ValueError("a majorities ring needs 5 or more replicas")
        reach = (len(ids) // 2 + 1) // 2  # neighbours on each side: self + 2 * reach is a majority
        cuts = [([a], [b]) for i, a in enumerate(ids) for j, b in enumerate(ids)
                if i < j and min(j - i, len(ids) - (j - i)) > reach]
        return cuts, f"majorities ring {' - '.join(ids)} (each sees its {reach} nearest on each side)", ids
    raise ValueError(f"unknown partition kind {kind!r}: one of {', '.join(Partition.KINDS)}")


class Netem:
    family = "netem"

    def __init__(self) -> None:
        self.delay_unavailable = netfault.delay_available()

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng)
        percent = rng.choice((10, 25, 40))
        netfault.lose(cluster.host_of[replica], percent)
        what = f"drop {percent}% of {replica}'s packets ({role})"
        if self.delay_unavailable is None:
            delay_ms = rng.choice((20, 50, 100))
            netfault.delay([cluster.host_of[replica]], delay_ms, delay_ms // 4)
            what += f", delay its packets {delay_ms} ms ± {delay_ms // 4}"
        return ActiveFault(self.family, what, [replica], [netfault.heal])


class DiskFull:
    family = "disk"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng, live_only=False)
        used = cluster.fill_disk(replica, DISK_FILL_PERCENT)
        return ActiveFault(self.family, f"fill {replica}'s filesystem to {used:.0f}% ({role})", [replica],
                           [lambda: cluster.free_disk(replica)])


def _wait_voters(cluster: ChaosCluster, timeout_s: float = VOTER_WAIT_S) -> list[str]:
    """Wait (bounded) until every replica votes: a second lost store before the first has caught up would be a
    majority of lost disks, which the group rightly does not recover from alone. The replicas still not voting."""
    deadline = time.monotonic() + timeout_s
    while (pending := [r for r in cluster.ids if not cluster.voting(r)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pending


def _follower(cluster: ChaosCluster, rng: random.Random, exclude: tuple[str, ...] = ()) -> str:
    master = cluster.master_id()
    followers = [r for r in cluster.ids if r != master and r not in exclude and cluster.alive(r)]
    if not followers:
        raise RuntimeError(f"no live follower to fault (master {master})")
    return rng.choice(followers)


class LostDisk:
    family = "lostdisk"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        if pending := _wait_voters(cluster):
            raise RuntimeError(f"{', '.join(pending)} still catching up as non-voters: not wiping another store")
        lagging = _follower(cluster, rng)
        cluster.signal(lagging, signal.SIGSTOP)
        undo = [lambda: cluster.signal(lagging, signal.SIGCONT)]
        time.sleep(LAG_S)
        master = cluster.master_id()
        if master not in (None, lagging) and rng.random() < 0.5:
            wiped, role = master, "the master"
        else:
            wiped, role = _follower(cluster, rng, exclude=(lagging,)), "a follower"
        cluster.kill(wiped)
        aside = cluster.wipe_store(wiped)
        cluster.restart(wiped)
        return ActiveFault(self.family, f"SIGSTOP {lagging} (lags); kill -9 {wiped} ({role}), its store moved to "
                           f"{os.path.relpath(aside, cluster.dev.base_dir)}, restarted empty", [lagging, wiped],
                           undo)


class BitFlip:
    family = "bitflip"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng)
        cluster.kill(replica)
        flipped = flip_sends(cluster.store_dir(replica), rng)
        cluster.restart(replica)
        what = ", ".join(f"entry {i} ({sid.decode()})" for i, sid in flipped) or "nothing (no send stored)"
        return ActiveFault(self.family, f"kill -9 {replica} ({role}), flipped a bit in {what}, restarted",
                           [replica], [lambda: read_back(cluster, replica, [sid for _, sid in flipped])])


def flip_sends(store_dir: str, rng: random.Random) -> list[tuple[int, bytes]]:
    """Flip a bit in up to FLIPPED_ENTRIES_MAX applied data entries, inside a send id: (index, id) of each."""
    applied = _applied_index(store_dir)
    env = lmdb.open(store_dir, max_dbs=logformat.MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            cur = txn.cursor(db=env.open_db(logformat.LOG_DB, txn=txn))
            found = [(logformat.key_index(k), m.group()) for k, v in cur
                     if logformat.key_index(k) <= applied and (m := SEND_ID.search(bytes(v)))]
    finally:
        env.close()
    chosen = rng.sample(found, min(FLIPPED_ENTRIES_MAX, len(found)))
    for index, send_id in chosen:
        storefault.flip_entry_bit(store_dir, index, send_id)
    return sorted(chosen)


def read_back(cluster: ChaosCluster, replica: str, send_ids: list[bytes], timeout_s: float = REPAIR_WAIT_S) -> None:
    """Read each flipped message on the replica (QueryMessage by key) until it is served: the replica finds the
    entry corrupt on that read, asks its peers for a verified copy and serves the repaired one."""
    from .workloads import TOPIC
    stub = ipb_grpc.BrokerAdminStub(cluster.dev.channel(cluster.dev.address_of[replica]))
    deadline = time.monotonic() + timeout_s
    pending = list(send_ids)
    while pending and time.monotonic() < deadline and cluster.alive(replica):
        key = pending[0].decode()
        try:
            answer = stub.QueryMessage(ipb.QueryMessageRequest(topic=TOPIC, key=key), timeout=2)
            if any(pending[0] in m for m in answer.messages):  # serialized Messages: the id is body and key
                pending.pop(0)
                continue
        except grpc.RpcError as exc:
            log.debug("reading %s on %s: %s", key, replica, exc)
        time.sleep(0.3)
    if pending:
        log.warning("bitflip: %s did not serve %s within %.0f s", replica, b", ".join(pending).decode(), timeout_s)


class Torn:
    family = "torn"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        def tear(store_dir: str) -> str:
            size = storefault.tear_data_file(store_dir, keep_ratio=rng.choice((0.25, 0.5, 0.75)))
            return f"data.mdb cut to {size} bytes"

        return _damage_and_restart(cluster, rng, self.family, tear)


class Garbage:
    family = "garbage"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        def damage(store_dir: str) -> str:
            index = rng.randint(1, max(1, _applied_index(store_dir)))
            if rng.random() < 0.5:
                what, pages = "random bytes", storefault.garbage_leaf_pages(store_dir, index, rng)
            else:  # a misdirected write: LMDB fails an assertion on it and aborts whoever walks the tree
                what, pages = "a branch page", storefault.misdirect_branch_page(store_dir, index)
            return f"{what} written over the B-tree leaf pages {pages} (those holding entry {index})"

        return _damage_and_restart(cluster, rng, self.family, damage)


def _damage_and_restart(cluster: ChaosCluster, rng: random.Random, family: str,
                        damage: Callable[[str], str]) -> ActiveFault:
    """kill -9 a minority replica, damage its stopped store (`damage(store_dir)` says how), start it once: it must
    refuse the store. Healed by the replace-a-disk procedure."""
    if pending := _wait_voters(cluster):  # its heal replaces a disk: not while another store catches up
        raise RuntimeError(f"{', '.join(pending)} still catching up as non-voters: not damaging another store")
    replica, role = _target(cluster, rng)
    cluster.kill(replica)
    what = damage(cluster.store_dir(replica))
    try:
        cluster.start_once(replica)
        outcome = "it STARTED on the damaged store"
        log.warning("%s: %s started on a damaged store (%s)", family, replica, what)
    except RuntimeError:
        outcome = "it refused to start" + (" (StoreDamagedError)" if cluster.store_refused(replica) else "")
    return ActiveFault(family, f"kill -9 {replica} ({role}), {what}: {outcome}", [replica],
                       [lambda: replace_disk(cluster, replica)])


def _applied_index(store_dir: str) -> int:
    env = lmdb.open(store_dir, max_dbs=logformat.MAX_DBS, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(logformat.META_APPLIED_INDEX, db=env.open_db(logformat.META_DB, txn=txn))
            return logformat.decode_u64(raw) if raw else 0
    finally:
        env.close()


def replace_disk(cluster: ChaosCluster, replica: str) -> None:
    """The replace-a-disk procedure: stop it, move its store aside (kept), start it on an empty store."""
    cluster.stop_replica(replica)
    aside = cluster.wipe_store(replica)
    log.info("%s's store moved to %s; it starts on an empty store", replica, aside)
    cluster.restart(replica)


class Crash:
    family = "crash"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        boot_id = str(uuid.UUID(int=rng.getrandbits(128)))
        for replica in cluster.ids:
            cluster.kill(replica)
        for replica in cluster.ids:
            with open(cluster.open_marker(replica), "w") as f:
                f.write(f"{boot_id} {cluster.flush}")
        for replica in cluster.ids:
            cluster.restart(replica)
        return ActiveFault(self.family, f"crash of every replica (kill -9, store.open says boot {boot_id[:8]} "
                           f"{cluster.flush}), restarted", list(cluster.ids),
                           [lambda: [cluster.restart(r) for r in cluster.ids]])


class Replace:
    family = "replace"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        if pending := _wait_voters(cluster):
            raise RuntimeError(f"{', '.join(pending)} still catching up as non-voters: not replacing another disk")
        replica = _follower(cluster, rng)
        replace_disk(cluster, replica)
        return ActiveFault(self.family, f"replace {replica}'s disk (a follower): stopped, store moved aside, "
                           "restarted empty", [replica], [lambda: log_vote(cluster, replica)])


def log_vote(cluster: ChaosCluster, replica: str) -> None:
    pending = _wait_voters(cluster)
    log.info("%s %s", replica, "still catches up (a non-voter)" if replica in pending else "votes again")


class ClockSkew:
    family = "clockskew"
    backlog_s = 1.0  # --expose-retention: what was sent before a clock ran ahead is what it would delete

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        replica, role = _target(cluster, rng)
        return _clock_ahead(self.family, cluster, replica, f"{replica}'s clock ({role})")


class ClockStep:
    family = "clockstep"
    backlog_s = 1.0

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = cluster.master_id()
        if master is None:
            return ActiveFault(self.family, "no master: no clock step", [])
        return _clock_ahead(self.family, cluster, master, f"the master {master}'s clock steps")


def _clock_ahead(family: str, cluster: ChaosCluster, replica: str, what: str) -> ActiveFault:
    """`replica`'s clock CLOCK_OFFSET_S ahead until healed."""
    cluster.shift_clock(replica, CLOCK_OFFSET_S)
    return ActiveFault(family, f"{what} {CLOCK_OFFSET_S / 86_400:+.0f} days", [replica],
                       [lambda: cluster.shift_clock(replica, 0)])


class ClockBehind:
    family = "clockbehind"
    backlog_s = 0.0  # --expose-retention: what it stamps heads every queue, where a correct master's retention looks
    # --expose-retention: senders wait until their routes name the new master (a send to the old one is forwarded,
    # and stamped there)
    settle_s = ClientConfig().route_refresh_interval_s + 1.0

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = cluster.master_id()
        followers = [r for r in cluster.ids if r != master and cluster.alive(r)]
        if master is None or not followers:
            return ActiveFault(self.family, "no master or no live follower: no clock fault", [])
        behind = rng.choice(followers)
        cluster.shift_clock(behind, -CLOCK_OFFSET_S)
        moved = _transfer(cluster, master, behind)

        def take_over() -> None:
            now = cluster.master_id()
            if now == behind:
                others = [r for r in cluster.ids if r != behind and cluster.alive(r)]
                if others:
                    target = rng.choice(others)
                    log.info("clockbehind: mastership %s -> %s (%s)", behind, target,
                             _transfer(cluster, behind, target))
            cluster.shift_clock(behind, 0)

        return ActiveFault(self.family, f"{behind}'s clock -3 days, transfer {master} -> {behind} ({moved})",
                           [behind], [take_over])


def _transfer(cluster: ChaosCluster, master: str, target: str) -> str:
    """Ask `master` to hand leadership to `target`; what it answered."""
    stub = ipb_grpc.BrokerAdminStub(cluster.dev.channel(cluster.dev.address_of[master]))
    try:
        answer = stub.TransferLeader(ipb.TransferLeaderRequest(to=target, timeout_ms=TRANSFER_TIMEOUT_MS),
                                     timeout=TRANSFER_TIMEOUT_MS / 1000 + 5)
        return f"{answer.new_master or 'no new master'}: {answer.message or 'OK'}"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"


TRANSFER_TIMEOUT_MS = 5_000
CATCH_UP_S = 30.0  # rolling: how long a restarted replica may take to catch up before the next one stops


class Transfer:
    family = "transfer"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = cluster.master_id()
        followers = [r for r in cluster.ids if r != master and cluster.alive(r)]
        if master is None or not followers:
            return ActiveFault(self.family, "no master or no live follower: no transfer", [])
        target = rng.choice(followers)
        outcome = _transfer(cluster, master, target)
        return ActiveFault(self.family, f"transfer leadership {master} -> {target} ({outcome})", [master, target])


class Rolling:
    family = "rolling"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = cluster.master_id()
        order = [r for r in cluster.ids if r != master] + ([master] if master is not None else [])
        for replica in order:
            cluster.stop_replica(replica)
            cluster.restart(replica)
            caught_up(cluster, replica)
        return ActiveFault(self.family, f"rolling restart (SIGTERM, restart, catch up) of {', '.join(order)}", order)


def caught_up(cluster: ChaosCluster, replica: str, timeout_s: float = CATCH_UP_S) -> None:
    """Waits until the replica has applied what the master had committed when it came back (or timeout_s)."""
    deadline = time.monotonic() + timeout_s
    target = None
    while time.monotonic() < deadline:
        statuses = cluster.dev.statuses()
        mine = statuses.get(replica)
        leader = next((s for s in statuses.values() if s is not None and s.role == "LEADER"), None)
        if target is None and leader is not None:
            target = leader.commit_index
        if mine is not None and target is not None and mine.applied_index >= target:
            return
        time.sleep(0.1)
    log.warning("%s did not catch up within %.0f s; the rolling restart goes on", replica, timeout_s)


MEMBERSHIP_TIMEOUT_MS = 10_000


class Membership:
    family = "membership"

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = cluster.master_id()
        olds = [r for r in cluster.ids if r != master and cluster.alive(r)]
        if master is None or not olds:
            return ActiveFault(self.family, "no master or no live follower: no membership change", [])
        gone = rng.choice(olds)
        new, spec = cluster.add_replica()
        ok, added = _membership_call(cluster, master, "AddReplica", spec)
        if not ok:
            return ActiveFault(self.family, f"add {spec}: {added}", [new])
        pending = _wait_voters(cluster)
        if new in pending:
            return ActiveFault(self.family, f"added {new} ({added}); it did not vote within {VOTER_WAIT_S:.0f} s: "
                               f"{gone} stays", [new])
        master = cluster.master_id() or master
        if master == gone:
            return ActiveFault(self.family, f"added {new} ({added}); {gone} became master: it stays", [new])
        ok, removed = _membership_call(cluster, master, "RemoveReplica", gone)
        if ok:
            cluster.retire(gone)
        return ActiveFault(self.family, f"replace {gone} with {new}: added ({added}), voting, "
                           f"{'removed and stopped' if ok else 'not removed'} ({removed})", [new, gone])


def _membership_call(cluster: ChaosCluster, master: str, rpc: str, replica: str) -> tuple[bool, str]:
    stub = ipb_grpc.BrokerAdminStub(cluster.dev.channel(cluster.dev.address_of[master]))
    request = (ipb.AddReplicaRequest if rpc == "AddReplica" else ipb.RemoveReplicaRequest)(
        replica=replica, timeout_ms=MEMBERSHIP_TIMEOUT_MS)
    try:
        answer = getattr(stub, rpc)(request, timeout=MEMBERSHIP_TIMEOUT_MS / 1000 + 5)
    except grpc.RpcError as exc:
        return False, f"{exc.code().name}: {exc.details()}"
    return answer.code == Code.OK, answer.message or "OK"


CLASSES = {"kill": Kill, "pause": Pause, "partition": Partition, "netem": Netem, "disk": DiskFull,
           "lostdisk": LostDisk, "bitflip": BitFlip, "torn": Torn, "garbage": Garbage, "crash": Crash,
           "replace": Replace, "transfer": Transfer, "rolling": Rolling,
           "membership": Membership, "clockskew": ClockSkew, "clockstep": ClockStep, "clockbehind": ClockBehind}


def parse(spec: str) -> list[str]:
    """'kill,partition' -> ['kill', 'partition']; 'all' -> every family; 'addkill:new-learner' -> one step of a
    family of memberkill.py. Raises ValueError naming the bad one."""
    names = list(BASIC) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n.partition(":")[0] not in FAMILIES and n != "none"]
    if bad:
        raise ValueError(f"unknown nemesis {', '.join(bad)}: choose from {', '.join(FAMILIES)}, "
                         f"'all' ({', '.join(BASIC)}) or 'none'")
    for name in names:
        if ":" in name:
            make(name)  # a step the family does not have, or a step given to a family without steps
    return [n for n in names if n != "none"]


def make(name: str):
    """The nemesis `name` ('kill', 'addkill', 'addkill:new-learner') names."""
    family, _, step = name.partition(":")
    if family in MEMBERSHIP_KILLS:
        from . import memberkill  # it builds on this module
        return memberkill.CLASSES[family](step or None)
    if step:
        raise ValueError(f"{family} has no steps ({name!r}): steps are for {', '.join(MEMBERSHIP_KILLS)}")
    return CLASSES[family]()


def needs_root(families: list[str]) -> list[str]:
    return [f for f in families if f in ("partition", "netem", "disk")]
