"""Real network faults between local replicas, with nftables (a nemesis building block).

Every replica has its own loopback address (127.0.0.x) and binds its outgoing sockets to it, so
dropping packets by source/destination address cuts exactly the links we name. All rules live in one
nftables table of our own (`inet rocketraft_test`); `heal()` deletes the table, leaving the host's
ruleset as it was. Only addresses in 127.0.0.0/8 are ever named.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterable

TABLE = "rocketraft_test"


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
    """Remove every rule this module made."""
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)


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
