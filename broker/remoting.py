"""The broker's Remoting door (RocketMQ 4.x clients): each request code turned into a call of the same jobs the gRPC
door calls (writes.py, consume.py, topics.py), each result into RocketMQ's response. Conversion lives here; every
rule, limit and error mapping lives where the gRPC door finds it too (validation.py, rocketraft.remoting.codes).

This module is the door's lifecycle: its server, the keepalive of its clients' sessions and the wiring of its request
families, each in its own module: remoting_sessions (heartbeats, client sessions, group members, transaction
check-backs), remoting_messages (send, pull, send-back, end of a transaction), remoting_offsets (consumer offsets,
queue positions, orderly consumers' locks) and remoting_admin (mqadmin's calls, message queries); remoting_table maps
each request code to its family, remoting_door holds what the families share and remoting_fields reads requests.

What is served, what is not and why: docs/client.md, "RocketMQ 4.x clients".
"""

from __future__ import annotations

import asyncio
import logging

from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.tls import TLS_OFF, ServerTls
from serverkit.remoting_acl import RemotingGuard
from serverkit.remoting_server import Handler, RemotingServer

from . import remoting_table
from .clients import ClientRegistry
from .config import BrokerConfig
from .consume import Consume
from .queries import Queries
from .remoting_admin import RemotingAdmin
from .remoting_door import Door
from .remoting_messages import RemotingMessages
from .remoting_offsets import RemotingOffsets
from .remoting_sessions import RemotingSessions
from .topics import Topics
from .writes import Writes

log = logging.getLogger(__name__)

KEEPALIVE_S = 5.0  # how often the sessions of open connections are kept alive


class BrokerRemoting:
    def __init__(self, config: BrokerConfig, *, topics: Topics, writes: Writes, consume: Consume,
                 clients: ClientRegistry, queries: Queries, guard: RemotingGuard | None = None,
                 server_tls: ServerTls = TLS_OFF):
        self.config = config
        self.server_tls = server_tls
        self.door = Door(config, topics=topics, writes=writes, consume=consume, clients=clients, queries=queries,
                         guard=guard)
        self.sessions = RemotingSessions(self.door)
        self.messages = RemotingMessages(self.door, self.sessions)
        self.offsets = RemotingOffsets(self.door)
        self.admin = RemotingAdmin(self.door)
        self.server: RemotingServer | None = None
        self._keepalive_task: asyncio.Task | None = None

    @property
    def guard(self) -> RemotingGuard | None:
        """ACL 2.0 on: every request signed and allowed (serverkit/remoting_acl.py); set before start()."""
        return self.door.guard

    @guard.setter
    def guard(self, guard: RemotingGuard | None) -> None:
        self.door.guard = guard

    @property
    def store_host(self) -> str:
        """This replica's advertised Remoting address, once bound."""
        return self.door.store_host

    def handlers(self) -> dict[int, Handler]:
        return remoting_table.handlers(self.sessions, self.messages, self.offsets, self.admin)

    async def start(self, listen: str) -> str:
        self.server = RemotingServer(listen, self.handlers(), f"broker {self.config.brokerName}", tls=self.server_tls,
                                     authorize=self.guard)
        self.server.on_close.append(self.sessions.closed)
        bound = await self.server.start()
        self._keepalive_task = asyncio.get_running_loop().create_task(self._keepalive(), name="remoting-keepalive")
        host = self.config.advertised.rpartition(":")[0]
        self.door.store_host = f"{host}:{bound.rpartition(':')[2]}"
        log.info("Remoting door (RocketMQ 4.x clients) on %s, advertised as %s", bound, self.store_host)
        return self.store_host

    async def stop(self) -> None:
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        self.sessions.stop()
        if self.server is not None:
            await self.server.stop()

    async def _keepalive(self) -> None:
        """A 4.x client heartbeats every 30 s, as long as clientExpiryMillis: while its connection is open it is
        alive, so its session (check-backs, group membership) is kept."""
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            for conn in list(self.server.connections if self.server else ()):
                if conn.client_id:
                    try:
                        self.door.clients.touch(conn.client_id)
                    except RocketraftError as exc:  # clientsMax reached: the client is told at its next request
                        log.info("4.x client %s not kept alive: %s", conn.client_id, exc.message)
