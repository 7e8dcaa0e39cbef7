"""kill -9 at each step of an online membership change or a leadership transfer (issue 31): the master, the target
(the replica being removed, or handed leadership) or the new replica (the one being added).

  addkill       start a fresh replica at a new address and add it (BrokerAdmin.AddReplica: a learner, promoted by
                the master once caught up); kill -9, at step
                  master-adding    the master, as soon as its log says it stored the add (it may not be committed)
                  new-learner      the new replica, once it has applied half of the index its log says it
                                   catches up to (a snapshot's install usually takes it past that at once)
                  new-promoted     the new replica, as soon as the master promoted it (4 voters, 3 running)
  removekill    remove a follower from the group of 3 (RemoveReplica); kill -9, at step
                  master-removing  the master, as soon as its log says it stored the removal. If the other follower
                                   stored it too, its members are 2, one of them dead: a majority really gone, no
                                   master until the killed one is back (Raft cannot do better; replace, which adds
                                   first, keeps a majority)
                  target-removing  the follower being removed, at that same moment
  replacekill   add a fresh replica, wait until it is promoted, remove an old follower; kill -9, at step
                  master-at-4      the master, once the new replica is promoted (4 voters, 3 running)
                  master-removing  the master, as soon as its log says it stored the removal of the old follower
                  old-removing     the old follower being removed, at that same moment
                  new-replaced     the new replica, as soon as the removal was answered (it is one of 3 voters)
  transferkill  ask the master to hand leadership to a follower (TransferLeader); kill -9, as soon as the master's
                log says it hands leadership over, at step
                  target           the target
                  master           the master

`--nemesis addkill` picks a step per fault at random; `--nemesis addkill:new-learner` always that one. Each fault
says what it did, what each call answered, and the leaderless interval: from the kill to the first master the
NameServer names that runs and says it leads (its own Status), polled every 20 ms from the kill on (results.json:
the fault's leaderless_s). A step waits for what triggers it at most TRIGGER_WAIT_S; if that never comes, nothing is
killed and the description says so.

Healed by restore(): every killed member restarted, every replica that is no member (removed, or whose add was lost
with a master) stopped, a learner promoted (or removed if it never catches up), and the group brought back to its
size with AddReplica / RemoveReplica, every member running and voting, so that the next fault starts from a healthy
group. Not in 'all'.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from broker.config import BrokerConfig
from rocketraft.protocol.wire import Code, ipb, ipb_grpc

from .cluster import ChaosCluster
from .nemesis import ActiveFault, _transfer

log = logging.getLogger(__name__)

ELECTION_TIMEOUT_S = BrokerConfig.dLegerElectionTimeoutMaxMs / 1000  # the "one election timeout" of the goal
LEADER_POLL_S = 0.02
LEADERLESS_WAIT_S = 10.0  # inject waits this long for a master after a kill; the heal goes on measuring
TRIGGER_WAIT_S = 20.0  # the log line (or state) a step kills on
CALL_TIMEOUT_S = 15.0  # a membership call or a transfer is answered within this (the broker's own bound is 10 s)
PROMOTE_WAIT_S = 30.0  # a learner not promoted in this long is removed by restore()
RESTORE_S = 90.0
HEALTHY_WAIT_S = 30.0  # before a fault: the group must be healthy within this
BEHIND_ENTRIES_MAX = 200  # healthy: every member has applied the master's commit index but this many entries
LOG_POLL_S = 0.002
MEMBERS_NOW = re.compile(r"members are now (.*) \(were ")
CATCHES_UP = re.compile(r"\(non-voter\) catches up to index (\d+)")


def member_ids(raft_peers) -> list[str]:
    """["n0-127.0.0.11:4000", ...] -> ["n0", ...]"""
    return sorted(peer.split("-", 1)[0] for peer in raft_peers)


def _in_members(replica: str, members_text: str) -> bool:
    return re.search(rf"(^|, ){re.escape(replica)}-", members_text) is not None


class LogWatch:
    """The lines a replica's log gets from now on: a step kills on what a log says, within milliseconds."""

    def __init__(self, path: str):
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._file.seek(0, 2)
        self._partial = b""

    def wait(self, matches: Callable[[str], bool], until: Callable[[], bool] = lambda: False,
             timeout_s: float = TRIGGER_WAIT_S) -> str | None:
        """The first new line `matches` accepts; None once `until()` (the call that would have logged it was
        answered: what it logged before is read first) or after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            finished = until()
            chunk = self._file.read()
            if chunk:
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    if matches(text):
                        return text
            if finished or time.monotonic() >= deadline:
                return None
            time.sleep(LOG_POLL_S)

    def close(self) -> None:
        self._file.close()


def _watch(cluster: ChaosCluster, replica: str) -> LogWatch:
    return LogWatch(cluster.dev.brokers[replica].log_path)


class Call:
    """A BrokerAdmin call on a thread of its own: the step kills while it is in flight."""

    def __init__(self, what: Callable[[], str]):
        self._answer: str | None = None
        self._thread = threading.Thread(target=self._run, args=(what,), name="nemesis-call", daemon=True)
        self._thread.start()

    def _run(self, what: Callable[[], str]) -> None:
        self._answer = what()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def answer(self, timeout_s: float = CALL_TIMEOUT_S + 5) -> str:
        self._thread.join(timeout_s)
        return self._answer if self._answer is not None else f"no answer within {timeout_s:.0f} s"


def change(cluster: ChaosCluster, master: str, rpc: str, replica: str) -> tuple[bool, str]:
    """AddReplica or RemoveReplica asked of `master`: (committed, what it answered)."""
    stub = ipb_grpc.BrokerAdminStub(cluster.dev.channel(cluster.dev.address_of[master]))
    request = (ipb.AddReplicaRequest if rpc == "AddReplica" else ipb.RemoveReplicaRequest)(
        replica=replica, timeout_ms=round(CALL_TIMEOUT_S * 1000) - 5000)
    try:
        answer = getattr(stub, rpc)(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return False, f"{exc.code().name}: {exc.details()}"
    if answer.code == Code.OK:
        return True, f"OK: {answer.message}"
    return False, f"{_code_name(answer.code)}: {answer.message}"


def _code_name(code: int) -> str:
    try:
        return Code.Name(code)
    except ValueError:
        return str(code)


# -- the group's state -------------------------------------------------------------------------------------------
def leader(cluster: ChaosCluster) -> str | None:
    """The master the NameServer names, if it runs and its own Status says it leads."""
    master = cluster.master_id()
    if master is None or master not in cluster.dev.brokers or not cluster.alive(master):
        return None
    status = cluster.dev.replica_status(master, timeout_s=0.5)
    return master if status is not None and status.role == "LEADER" else None


def wait_leader(cluster: ChaosCluster, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while (master := leader(cluster)) is None and time.monotonic() < deadline:
        time.sleep(LEADER_POLL_S)
    return master


def members(cluster: ChaosCluster, master: str) -> list[str]:
    """The group's members (learners included) as the master's log says now; [] if it does not answer."""
    status = cluster.dev.replica_status(master, timeout_s=1.0)
    return member_ids(status.raft_peers) if status is not None else []


def votes(cluster: ChaosCluster, replica: str) -> bool:
    """It runs, is no learner and is not catching up (its own Status)."""
    status = cluster.dev.replica_status(replica, timeout_s=1.0)
    return status is not None and not status.learner and not status.non_voter


def unhealthy(cluster: ChaosCluster) -> tuple[str | None, str]:
    """(master, what is wrong; "" for a group of its size whose members all run and vote, and that are the replicas
    the cluster runs)."""
    master = leader(cluster)
    if master is None:
        return None, "no master"
    now = members(cluster, master)
    if len(now) != cluster.dev.replicas or sorted(cluster.ids) != now:
        return master, f"members {', '.join(now)}, replicas run {', '.join(sorted(cluster.ids))}"
    statuses = {r: cluster.dev.replica_status(r, timeout_s=1.0) for r in now}
    silent = [r for r, st in statuses.items() if st is None or st.learner or st.non_voter]
    if silent:
        return master, f"{', '.join(silent)} down, a learner or catching up"
    commit = statuses[master].commit_index
    behind = [r for r, st in statuses.items() if st.applied_index + BEHIND_ENTRIES_MAX < commit]
    return master, f"{', '.join(behind)} more than {BEHIND_ENTRIES_MAX} entries behind" if behind else ""


def wait_healthy(cluster: ChaosCluster, timeout_s: float = HEALTHY_WAIT_S) -> str:
    """The master of a healthy group; RuntimeError naming what is wrong after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        master, wrong = unhealthy(cluster)
        if not wrong:
            return master
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the group is not healthy ({wrong}): no fault injected")
        time.sleep(0.2)


# -- a kill and the leaderless interval after it -------------------------------------------------------------------
@dataclass
class Outage:
    """kill -9 of one replica, and the time until the group has a master again, watched from the kill on (on a
    thread of its own: the step meanwhile waits for what its calls answer)."""
    cluster: ChaosCluster
    replica: str
    role: str
    at: float = 0.0
    leaderless_s: float | None = None
    master: str | None = None

    def __post_init__(self) -> None:
        self.cluster.kill(self.replica)
        self.at = time.monotonic()
        self._watching = threading.Thread(target=self._watch, args=(LEADERLESS_WAIT_S,), name="nemesis-outage",
                                          daemon=True)
        self._watching.start()

    def _watch(self, until_s: float) -> None:
        """Wait (at most until `until_s` after the kill) for a running master: the killed one while it is dead never
        counts (the NameServer names it until another registers), and once restarted it may lead again."""
        self.master = wait_leader(self.cluster, max(0.0, self.at + until_s - time.monotonic()))
        if self.master is not None:
            self.leaderless_s = round(time.monotonic() - self.at, 3)

    def measure(self, until_s: float = LEADERLESS_WAIT_S) -> None:
        """The leaderless interval, waiting for a master at most until `until_s` after the kill."""
        self._watching.join()
        if self.leaderless_s is None and until_s > LEADERLESS_WAIT_S:
            self._watch(until_s)

    def text(self) -> str:
        if self.leaderless_s is None:
            return f"NO MASTER within {time.monotonic() - self.at:.1f} s of the kill ({self._views()})"
        beyond = f", beyond one election timeout ({ELECTION_TIMEOUT_S:g} s)" if self.leaderless_s > ELECTION_TIMEOUT_S \
            else ""
        return f"master {self.master} named {self.leaderless_s:.3f} s after the kill{beyond}"

    def _views(self) -> str:
        """What each running replica's log says the members are: who could still make a majority."""
        views = []
        for replica in sorted(self.cluster.ids):
            status = self.cluster.dev.replica_status(replica, timeout_s=0.5)
            if status is not None:
                views.append(f"{replica} ({status.role}) holds members {', '.join(member_ids(status.raft_peers))}")
        return "; ".join(views) + ("" if self.cluster.alive(self.replica) else f"; {self.replica} is dead")


# -- the families --------------------------------------------------------------------------------------------------
class _KillDuringChange:
    family = ""
    STEPS: tuple[str, ...] = ()

    def __init__(self, step: str | None = None):
        if step is not None and step not in self.STEPS:
            raise ValueError(f"{self.family} has no step {step!r}: one of {', '.join(self.STEPS)}")
        self.step = step

    def inject(self, cluster: ChaosCluster, rng: random.Random) -> ActiveFault:
        master = wait_healthy(cluster)
        step = self.step or rng.choice(self.STEPS)
        did: list[str] = []
        try:
            outage, leaving = getattr(self, "_" + step.replace("-", "_"))(cluster, rng, master, did)
        except Exception as exc:
            did.append(f"{type(exc).__name__}: {exc}")
            outage = None
        if outage is None:  # reported as a fault not injected; the group is healed before the next one
            raise RuntimeError(f"{self.family} {step}: {'; '.join(did)}; nothing killed; healed: "
                               f"{restore(cluster, rng)}")
        outage.measure()
        did.append(outage.text())
        fault = ActiveFault(self.family, f"{self.family} {step}: " + "; ".join(did), [outage.replica])
        fault.leaderless_s = outage.leaderless_s
        fault.undo.append(lambda: _heal(cluster, rng, fault, outage, leaving))
        return fault


def _heal(cluster: ChaosCluster, rng: random.Random, fault: ActiveFault, outage: Outage | None,
          leaving: str | None) -> None:
    """restore(), and the leaderless interval of a kill after which no master came within LEADERLESS_WAIT_S (one
    comes once the killed replica is back: the fault's description says which)."""
    stuck = outage is not None and outage.leaderless_s is None
    if stuck:
        cluster.restart(outage.replica)
        outage.measure(until_s=time.monotonic() - outage.at + RESTORE_S / 3)  # from now, at most RESTORE_S / 3
        fault.description += f"; once {outage.replica} was restarted: {outage.text()}"
        fault.leaderless_s = outage.leaderless_s
    fault.description += f"; healed: {restore(cluster, rng, leaving)}"


def _followers(cluster: ChaosCluster, master: str) -> list[str]:
    return sorted(r for r in cluster.ids if r != master)


def _add_fresh(cluster: ChaosCluster, did: list[str]) -> tuple[str, str]:
    new, spec = cluster.add_replica()
    did.append(f"{new} started empty at {cluster.host_of[new]}")
    return new, spec


class AddKill(_KillDuringChange):
    family = "addkill"
    STEPS = ("master-adding", "new-learner", "new-promoted")

    def _master_adding(self, cluster, rng, master, did):
        leaving = rng.choice(_followers(cluster, master))  # removed by the heal: the group back to its size
        new, spec = _add_fresh(cluster, did)
        watch = _watch(cluster, master)
        try:
            call = Call(lambda: change(cluster, master, "AddReplica", spec)[1])
            stored = watch.wait(lambda line: (m := MEMBERS_NOW.search(line)) is not None and _in_members(new, m[1]),
                                call.done)
        finally:
            watch.close()
        if stored is None:
            did.append(f"AddReplica {new} asked of {master}: its log never said it stored it ({call.answer()})")
            return None, leaving
        outage = Outage(cluster, master, "the master")
        did.append(f"AddReplica {new} asked of the master {master}; kill -9 {master} once its log stored the add; "
                   f"AddReplica answered {call.answer()}")
        return outage, leaving

    def _new_learner(self, cluster, rng, master, did):
        leaving = rng.choice(_followers(cluster, master))
        new, spec = _add_fresh(cluster, did)
        watch = _watch(cluster, new)
        try:
            call = Call(lambda: change(cluster, master, "AddReplica", spec)[1])
            # not stopped by the answer: the old voters commit the add before the new replica hears of it
            target = watch.wait(lambda line: CATCHES_UP.search(line) is not None)
        finally:
            watch.close()
        if target is None:
            did.append(f"AddReplica {new} asked of {master} ({call.answer()}): {new}'s log never said it catches up")
            return None, leaving
        goal = int(CATCHES_UP.search(target)[1])
        state = _halfway(cluster, new, goal)
        outage = Outage(cluster, new, "the new replica")
        did.append(f"AddReplica {new} asked of the master {master}; kill -9 {new} once it had applied half of the "
                   f"index {goal} it catches up to ({state}); AddReplica answered {call.answer()}")
        return outage, leaving

    def _new_promoted(self, cluster, rng, master, did):
        leaving = rng.choice(_followers(cluster, master))
        new, spec = _add_fresh(cluster, did)
        ok, answer = change(cluster, master, "AddReplica", spec)
        did.append(f"AddReplica {new} asked of the master {master}: {answer}")
        if not ok:
            return None, leaving
        waited = _wait_promoted(cluster, new)
        if waited is None:
            did.append(f"{new} was not promoted within {PROMOTE_WAIT_S:.0f} s")
            return None, leaving
        did.append(f"promoted {waited:.2f} s after the add was answered; kill -9 {new} (4 voters, 3 running)")
        return Outage(cluster, new, "the new replica"), leaving


def _halfway(cluster: ChaosCluster, new: str, goal: int) -> str:
    """Wait (at most TRIGGER_WAIT_S) until the new replica has applied half of what it catches up to; where it is
    then."""
    deadline = time.monotonic() + TRIGGER_WAIT_S
    while (status := cluster.dev.replica_status(new, 0.5)) is None or status.applied_index < goal // 2:
        if time.monotonic() >= deadline:
            return "its Status did not answer" if status is None else \
                f"still at applied index {status.applied_index} after {TRIGGER_WAIT_S:.0f} s"
        time.sleep(LOG_POLL_S)
    if not status.learner and not status.non_voter:
        return f"too late: it was promoted already, applied index {status.applied_index}"
    role = "a learner" if status.learner else "not yet told it is a learner"
    return f"applied index {status.applied_index}, {role}, {'a non-voter' if status.non_voter else 'caught up'}"


def _wait_promoted(cluster: ChaosCluster, replica: str, timeout_s: float = PROMOTE_WAIT_S) -> float | None:
    """Seconds until the replica votes (promoted, caught up), None after timeout_s."""
    started = time.monotonic()
    while not votes(cluster, replica):
        if time.monotonic() - started >= timeout_s or not cluster.alive(replica):
            return None
        time.sleep(0.05)
    return time.monotonic() - started


def _remove_and_kill(cluster: ChaosCluster, master: str, target: str, victim: str, role: str,
                     did: list[str]) -> Outage | None:
    """RemoveReplica `target` asked of `master`; kill -9 `victim` once the master's log stored the removal."""
    watch = _watch(cluster, master)
    try:
        call = Call(lambda: change(cluster, master, "RemoveReplica", target)[1])
        stored = watch.wait(lambda line: (m := MEMBERS_NOW.search(line)) is not None
                            and not _in_members(target, m[1]), call.done)
    finally:
        watch.close()
    if stored is None:
        did.append(f"RemoveReplica {target} asked of {master}: its log never said it stored it ({call.answer()})")
        return None
    outage = Outage(cluster, victim, role)
    did.append(f"RemoveReplica {target} asked of the master {master}; kill -9 {victim} ({role}) once the master's "
               f"log stored the removal; RemoveReplica answered {call.answer()}")
    return outage


class RemoveKill(_KillDuringChange):
    family = "removekill"
    STEPS = ("master-removing", "target-removing")

    def _master_removing(self, cluster, rng, master, did):
        target = rng.choice(_followers(cluster, master))
        return _remove_and_kill(cluster, master, target, master, "the master", did), None

    def _target_removing(self, cluster, rng, master, did):
        target = rng.choice(_followers(cluster, master))
        return _remove_and_kill(cluster, master, target, target, "the replica being removed", did), None


class ReplaceKill(_KillDuringChange):
    family = "replacekill"
    STEPS = ("master-at-4", "master-removing", "old-removing", "new-replaced")

    def _added(self, cluster: ChaosCluster, master: str, did: list[str]) -> str | None:
        """A fresh replica added and promoted; None (said in did) if it was not."""
        new, spec = _add_fresh(cluster, did)
        ok, answer = change(cluster, master, "AddReplica", spec)
        waited = _wait_promoted(cluster, new) if ok else None
        did.append(f"AddReplica {new} asked of the master {master}: {answer}" +
                   (f"; promoted {waited:.2f} s later" if waited is not None else
                    f"; not promoted within {PROMOTE_WAIT_S:.0f} s" if ok else ""))
        return new if waited is not None else None

    def _old(self, cluster: ChaosCluster, rng: random.Random, new: str, did: list[str]) -> tuple[str, str] | None:
        """(master, an old follower to remove) once the new replica votes; None if there is no master now."""
        master = wait_leader(cluster, LEADERLESS_WAIT_S)
        if master is None:
            did.append("no master after the promotion")
            return None
        return master, rng.choice([r for r in _followers(cluster, master) if r != new])

    def _master_at_4(self, cluster, rng, master, did):
        new = self._added(cluster, master, did)
        if new is None:
            return None, None
        did.append(f"kill -9 {master} (the master; 4 voters, 3 running)")
        return Outage(cluster, master, "the master"), rng.choice([r for r in _followers(cluster, master) if r != new])

    def _master_removing(self, cluster, rng, master, did):
        return self._removing(cluster, rng, master, did, victim_is_master=True)

    def _old_removing(self, cluster, rng, master, did):
        return self._removing(cluster, rng, master, did, victim_is_master=False)

    def _removing(self, cluster, rng, master, did, victim_is_master: bool):
        new = self._added(cluster, master, did)
        picked = self._old(cluster, rng, new, did) if new is not None else None
        if picked is None:
            return None, None
        master, old = picked
        victim, role = (master, "the master") if victim_is_master else (old, "the replica being removed")
        return _remove_and_kill(cluster, master, old, victim, role, did), None

    def _new_replaced(self, cluster, rng, master, did):
        new = self._added(cluster, master, did)
        picked = self._old(cluster, rng, new, did) if new is not None else None
        if picked is None:
            return None, None
        master, old = picked
        ok, answer = change(cluster, master, "RemoveReplica", old)
        did.append(f"RemoveReplica {old} asked of the master {master}: {answer}")
        if not ok:
            return None, None
        cluster.retire(old)
        did.append(f"{old} stopped; kill -9 {new} (the new replica, one of 3 voters)")
        return Outage(cluster, new, "the new replica"), None


class TransferKill(_KillDuringChange):
    family = "transferkill"
    STEPS = ("target", "master")

    def _target(self, cluster, rng, master, did):
        return self._kill_mid_transfer(cluster, rng, master, did, kill_target=True), None

    def _master(self, cluster, rng, master, did):
        return self._kill_mid_transfer(cluster, rng, master, did, kill_target=False), None

    def _kill_mid_transfer(self, cluster, rng, master, did, kill_target: bool) -> Outage | None:
        target = rng.choice(_followers(cluster, master))
        watch = _watch(cluster, master)
        try:
            call = Call(lambda: _transfer(cluster, master, target))
            handing = watch.wait(lambda line: f"hands leadership to {target}:" in line, call.done)
        finally:
            watch.close()
        if handing is None:
            did.append(f"TransferLeader {master} -> {target}: its log never said it hands leadership over "
                       f"({call.answer()})")
            return None
        victim, role = (target, "the target") if kill_target else (master, "the master")
        outage = Outage(cluster, victim, role)
        did.append(f"TransferLeader {master} -> {target}; kill -9 {victim} ({role}) once the master's log said it "
                   f"hands leadership over; TransferLeader answered {call.answer()}")
        return outage


# -- healing: back to a group of its size, every member running and voting ----------------------------------------
def restore(cluster: ChaosCluster, rng: random.Random, leaving: str | None = None) -> str:
    """Restart killed members, stop replicas that are no members, wait for learners (remove one never promoted),
    then add fresh replicas or remove old followers (`leaving` first) until the group has its size; what it did.
    RuntimeError if the group is not healthy within RESTORE_S."""
    did: list[str] = []
    deadline = time.monotonic() + RESTORE_S
    learner_since: dict[str, float] = {}
    while time.monotonic() < deadline:
        master, wrong = unhealthy(cluster)
        if not wrong:
            return f"{', '.join(did) or 'nothing to do'}; members {', '.join(sorted(cluster.ids))}, all voting"
        if master is None:
            _restart_dead(cluster, cluster.ids, did)
            time.sleep(0.1)
            continue
        _restore_step(cluster, rng, master, leaving, learner_since, did)
    raise RuntimeError(f"the group is not back to {cluster.dev.replicas} running voters within {RESTORE_S:.0f} s "
                       f"({unhealthy(cluster)[1]}); did: {', '.join(did) or 'nothing'}")


def _restart_dead(cluster: ChaosCluster, replicas, did: list[str]) -> None:
    for replica in [r for r in replicas if not cluster.alive(r)]:
        cluster.restart(replica)
        did.append(f"restarted {replica}")


def _restore_step(cluster: ChaosCluster, rng: random.Random, master: str, leaving: str | None,
                  learner_since: dict[str, float], did: list[str]) -> None:
    now = members(cluster, master)
    if not now:
        return
    for replica in [r for r in cluster.ids if r not in now]:
        cluster.retire(replica)
        did.append(f"stopped {replica} (no member)")
    for replica in [r for r in now if r not in cluster.ids and r != master]:  # stopped, yet still a member
        did.append(f"removed {replica}, stopped but a member ({_ask(cluster, 'RemoveReplica', replica)[1]})")
        return
    _restart_dead(cluster, [r for r in now if r in cluster.ids], did)
    waiting = [r for r in now if r in cluster.ids and not votes(cluster, r)]
    for replica in [r for r in learner_since if r not in waiting]:
        did.append(f"{replica} votes {time.monotonic() - learner_since.pop(replica):.1f} s later")
    for replica in waiting:
        since = learner_since.setdefault(replica, time.monotonic())
        if time.monotonic() - since > PROMOTE_WAIT_S and replica != master:
            did.append(f"removed {replica}, not promoted within {PROMOTE_WAIT_S:.0f} s "
                       f"({_ask(cluster, 'RemoveReplica', replica)[1]})")
            cluster.retire(replica)
            return
    if waiting:
        time.sleep(0.2)
        return
    if len(now) > cluster.dev.replicas:
        olds = sorted((r for r in now if r != master), key=_added_order)
        victim = leaving if leaving in olds else rng.choice(olds[:-1] or olds)  # not the newest replica
        ok, answer = _ask(cluster, "RemoveReplica", victim)
        did.append(f"removed {victim} ({answer})")
        if ok:
            cluster.retire(victim)
    elif len(now) < cluster.dev.replicas:
        new, spec = cluster.add_replica()
        ok, answer = _ask(cluster, "AddReplica", spec)
        did.append(f"added {new} ({answer})")
        if not ok:
            cluster.retire(new)


def _added_order(replica: str) -> int:
    """n0, n1, ... in the order they were made (ChaosCluster.add_replica names the k-th replica n<k>)."""
    return int(replica[1:]) if replica[1:].isdigit() else 0


def _ask(cluster: ChaosCluster, rpc: str, replica: str, timeout_s: float = 30.0) -> tuple[bool, str]:
    """A membership change asked of whoever is master until it is answered OK (one change at a time: the master's
    own promotion of a learner may be in flight) or timeout_s passed; (ok, the last answer, naming the master)."""
    deadline = time.monotonic() + timeout_s
    answer = "no master"
    while time.monotonic() < deadline:
        master = wait_leader(cluster, max(0.0, deadline - time.monotonic()))
        if master is None:
            break
        ok, answer = change(cluster, master, rpc, replica)
        if ok:
            return True, f"{answer}, by {master}"
        time.sleep(0.3)
    return False, answer


CLASSES = {cls.family: cls for cls in (AddKill, RemoveKill, ReplaceKill, TransferKill)}
