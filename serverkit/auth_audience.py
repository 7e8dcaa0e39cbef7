"""Which server a proof of the cluster secret was made for (its audience), and whether this server is that one.

A caller signs the address it dialed ("host:port", exactly as it dialed it). A server accepts a proof whose audience
names it, so a proof observed on its way to one server is refused by every other (docs/security.md, "The cluster
secret"). A server answers to:
1. its own addresses: where it listens (with the port it bound), what it advertises, the address the NameServers
   dial, and the extra names an operator lists (`clusterAuthAudiences`, a key of the broker and the NameServer: a DNS
   name in front of it, a published port);
2. on the port it listens on, the host "localhost" when it listens on a loopback address, and any loopback host when
   it listens on every address (a caller on the same machine);
3. on the port it listens on, when it listens on every address (0.0.0.0, ::): a host name that resolves to an
   address of this machine (a compose service name).
Anything else is refused naming the audience and the setting that would accept it.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import socket
import time
from collections.abc import Iterable

RESOLVE_TIMEOUT_S = 1.0
RESOLVED_MAX = 256  # host names remembered at once (rule 3)
RESOLVED_TTL_S = 60.0
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def normalize(address: str) -> tuple[str, int] | None:
    """(host, port) of "host:port" or "[v6]:port", the host lower-cased without brackets; None if not an address."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]").lower(), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_local(ip: str) -> bool:
    """Whether `ip` is an address of this machine (a socket can bind to it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


class Audiences:
    """The names one server answers to as a proof's audience."""

    def __init__(self, listening: Iterable[str] = (), addresses: Iterable[str] = ()):
        """`listening`: where the server listens; `addresses`: its other names (advertised, the operator's list)."""
        self._known: set[tuple[str, int]] = set()
        self._listening: set[tuple[str, int]] = set()  # (host, port) it listens on
        self._resolved: collections.OrderedDict[str, tuple[float, bool]] = collections.OrderedDict()
        for address in listening:
            self.add(address, listening=True)
        for address in addresses:
            self.add(address)

    def add(self, address: str, listening: bool = False) -> None:
        """Answer to `address` too; `listening`: it is where this server listens (rules 2 and 3 apply to its port)."""
        parsed = normalize(address) if address else None
        if parsed is None or parsed[1] == 0:  # port 0: not bound yet (the bound address is added after)
            return
        self._known.add(parsed)
        if listening:
            self._listening.add(parsed)

    def describe(self) -> str:
        return ", ".join(sorted(f"{h}:{p}" if ":" not in h else f"[{h}]:{p}" for h, p in self._known)) or "(none)"

    async def refusal(self, audience: str) -> str | None:
        """None if a proof made for `audience` is meant for this server; otherwise why not."""
        parsed = normalize(audience)
        if parsed is None:
            return f"the proof names {audience!r} as its server, which is not a host:port"
        if parsed in self._known:
            return None
        host, port = parsed
        hosts = {h for h, p in self._listening if p == port}
        wildcard = bool(hosts & WILDCARD_HOSTS)
        if hosts and _is_loopback(host) and (wildcard or (host == "localhost" and any(map(_is_loopback, hosts)))):
            return None
        if hosts and wildcard and await self._resolves_here(host):
            return None
        return (f"the proof was made for {audience}, which is not this server ({self.describe()}): a proof is valid "
                f"only at the server it was sent to; if callers reach this server by that name (a DNS name, a "
                f"published port), list it in clusterAuthAudiences (broker and NameServer key)")

    async def _resolves_here(self, host: str) -> bool:
        now = time.monotonic()
        cached = self._resolved.get(host)
        if cached is not None and now - cached[0] < RESOLVED_TTL_S:
            return cached[1]
        try:
            infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None), RESOLVE_TIMEOUT_S)
            local = any(_is_local(info[4][0]) for info in infos)
        except (TimeoutError, OSError, UnicodeError):
            local = False
        self._resolved[host] = (now, local)
        self._resolved.move_to_end(host)
        while len(self._resolved) > RESOLVED_MAX:
            self._resolved.popitem(last=False)
        return local
