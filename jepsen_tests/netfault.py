"""Real network faults between local replicas (a nemesis building block).

Every replica has its own loopback address (127.0.0.x) and binds its outgoing sockets to it, so
dropping packets by source/destination address cuts exactly the links we name. Cuts and random packet loss
are nftables rules in one table of our own (`inet rocketraft_test`; in test worker N > 0 of a parallel suite,
`rocketraft_test_N`, so one worker's heal never deletes another's rules); delay is tc netem on `lo`, where the
kernel has sch_netem (many container kernels do not: `delay_available()` says). The qdisc on `lo` is one per
host, so a process holds an flock on LO_QDISC_LOCK from its first `delay()` until its `heal()`; another
process's `delay()` waits for it. `heal()` deletes our table and our qdisc, leaving the host as it was. Only
addresses in 127.0.0.0/8 are ever named.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterable

from devkit import workerslot

TABLE = "rocketraft_test" if workerslot.slot()[0] == 0 else f"rocketraft_test_{workerslot.slot()[0]}"
LO_QDISC_LOCK = "/run/lock/rocketraft-lo-qdisc.lock" if os.path.isdir("/run/lock") else "/tmp/rocketraft-lo-qdisc.lock"
_lo_lock_fd: int | None = None  # open while this process may own the qdisc on lo


class NetFaultUnavailable(RuntimeError):
    pass


def _check_loopback(ips: Iterable[str]) -> list[str]:
    out = []
    for ip in ips:
        if not ipaddress.ip_address(ip).is_loopback:
            raise ValueError(f"refusing to touch non-loopback address {ip}")
        out.append(ip)
    return out


def _nft(*args: str) -> None:
    result = subprocess.run(["nft", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetFaultUnavailable(f"nft {' '.join(args)} failed: {result.stderr.strip()}")


def available() -> str | None:
    """None if partitions can be made here, else the reason they cannot."""
    if shutil.which("nft") is None:
        return "nft (nftables) is not installed: apt-get install -y nftables"
    result = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    if result.returncode != 0:
        return f"nft cannot list tables (need root and nf_tables): {result.stderr.strip()}"
    return None


def heal() -> None:
    """Remove every rule this process made, and the qdisc on lo unless another process is using it."""
    global _lo_lock_fd
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
    fd = _lo_lock_fd if _lo_lock_fd is not None else _lock_lo(block=False)
    if fd is None:
        return  # another process holds the qdisc (its own delay) and will remove it
    try:
        if _our_qdisc_on_lo():
            subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    finally:
        os.close(fd)  # releases the flock
        _lo_lock_fd = None


def _lock_lo(block: bool) -> int | None:
    """An fd holding the exclusive flock on LO_QDISC_LOCK, or None if another process holds it (block=False)."""
    fd = os.open(LO_QDISC_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _ensure_table() -> None:
    _nft("add", "table", "inet", TABLE)
    for hook in ("input", "output"):
        _nft("add", "chain", "inet", TABLE, hook,
             f"{{ type filter hook {hook} priority -10 ; policy accept ; }}")


def cut(side_a: Iterable[str], side_b: Iterable[str]) -> None:
    """Drop all packets between every address of side_a and every address of side_b (both ways)."""
    a, b = _check_loopback(side_a), _check_loopback(side_b)
    if not a or not b:
        return
    _ensure_table()
    set_a, set_b = "{ " + ", ".join(a) + " }", "{ " + ", ".join(b) + " }"
    for hook in ("input", "output"):
        _nft("add", "rule", "inet", TABLE, hook, "ip", "saddr", set_a, "ip", "daddr", set_b, "drop")
        _nft("add", "rule", "inet", TABLE, hook, "ip", "saddr", set_b, "ip", "daddr", set_a, "drop")


def isolate(ip: str, others: Iterable[str]) -> None:
    cut([ip], [o for o in others if o != ip])


def partition(groups: list[list[str]]) -> None:
    """Split the addresses into groups that can talk only within themselves."""
    for i, g in enumerate(groups):
        for h in groups[i + 1:]:
            cut(g, h)


def lose(ip: str, percent: int) -> None:
    """Drop `percent` % of the packets from and to `ip`, at random (nftables numgen). Only in the output hook:
    on loopback every packet passes it exactly once, so the loss per packet is exactly `percent`."""
    [ip] = _check_loopback([ip])
    if not 0 < percent <= 100:
        raise ValueError(f"loss must be 1..100 %, not {percent}")
    _ensure_table()
    for direction in ("saddr", "daddr"):
        _nft("add", "rule", "inet", TABLE, "output", "ip", direction, ip,
             "numgen", "random", "mod", "100", "<", str(percent), "drop")


# -- delay: tc netem on lo (a prio qdisc whose extra band is netem, selected by u32 filters on our addresses) --
QDISC_HANDLE = "1:"
NETEM_BAND = "1:4"


def _tc(*args: str) -> None:
    result = subprocess.run(["tc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetFaultUnavailable(f"tc {' '.join(args)} failed: {result.stderr.strip()}")


def _our_qdisc_on_lo() -> bool:
    if shutil.which("tc") is None:
        return False
    shown = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    return "qdisc prio 1:" in shown


def delay_available() -> str | None:
    """None if `delay()` works here, else why not (tc missing, or a kernel without the prio/netem qdiscs)."""
    if shutil.which("tc") is None:
        return "tc is not installed: apt-get install -y iproute2"
    if _our_qdisc_on_lo():
        return None
    borrowed = _lo_lock_fd is None
    fd = _lock_lo(block=False) if borrowed else _lo_lock_fd
    if fd is None:
        return None  # another process holds the qdisc: it could add one, so this kernel can
    try:
        probe = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "handle", QDISC_HANDLE, "netem",
                                "delay", "0ms"], capture_output=True, text=True)
        if probe.returncode != 0:
            return f"this kernel cannot add a netem qdisc ({probe.stderr.strip()}): it lacks sch_netem"
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        return None
    finally:
        if borrowed:
            os.close(fd)


def delay(ips: Iterable[str], delay_ms: int, jitter_ms: int = 0) -> None:
    """Delay every packet sent from `ips` by delay_ms (± jitter_ms), with tc netem on lo."""
    global _lo_lock_fd
    ips = _check_loopback(ips)
    if _lo_lock_fd is None:
        _lo_lock_fd = _lock_lo(block=True)  # waits while another process's delay is on lo
    if not _our_qdisc_on_lo():
        _tc("qdisc", "add", "dev", "lo", "root", "handle", QDISC_HANDLE, "prio", "bands", "4",
            "priomap", *["0"] + ["1"] * 15)
        _tc("qdisc", "add", "dev", "lo", "parent", NETEM_BAND, "handle", "40:", "netem", "delay",
            f"{delay_ms}ms", f"{jitter_ms}ms")
    for ip in ips:
        _tc("filter", "add", "dev", "lo", "parent", QDISC_HANDLE, "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "src", f"{ip}/32", "flowid", NETEM_BAND)
