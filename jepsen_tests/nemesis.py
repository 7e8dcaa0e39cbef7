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
"""

from __future__ import annotations

import logging
import random
import signal
from dataclasses import dataclass, field

from . import netfault
from .cluster import ChaosCluster

log = logging.getLogger(__name__)

FAMILIES = ("kill", "pause", "partition", "netem", "disk")
DISK_FILL_PERCENT = 97.0


@dataclass
class ActiveFault:
    family: str
    description: str
    targets: list[str]
    undo: list = field(default_factory=list, repr=False)  # callables, run in reverse order

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


CLASSES = {"kill": Kill, "pause": Pause, "partition": Partition, "netem": Netem, "disk": DiskFull}


def parse(spec: str) -> list[str]:
    """'kill,partition' -> ['kill', 'partition']; 'all' -> every family. Raises ValueError naming the bad one."""
    names = list(FAMILIES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in FAMILIES and n != "none"]
    if bad:
        raise ValueError(f"unknown nemesis {', '.join(bad)}: choose from {', '.join(FAMILIES)}, 'all' or 'none'")
    return [n for n in names if n != "none"]


def needs_root(families: list[str]) -> list[str]:
    return [f for f in families if f in ("partition", "netem", "disk")]
