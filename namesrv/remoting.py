"""The NameServer's Remoting door (RocketMQ 4.x clients): topic routes (GET_ROUTEINFO_BY_TOPIC, retry topics included)
and cluster info (GET_BROKER_CLUSTER_INFO), from the same registry, auto-creation and errors as QueryRoute.
docs/client.md, "RocketMQ 4.x clients"."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rocketraft.protocol.errors import TopicNotFoundError
from rocketraft.protocol.tls import TLS_OFF, ServerTls
from rocketraft.remoting.codes import RemotingError, Request, Response
from rocketraft.remoting.frame import Command
from serverkit.remoting_acl import RemotingGuard
from serverkit.remoting_server import Connection, RemotingServer

if TYPE_CHECKING:
    from .core import NameServer


REMOTING_CODE_PREFIX = "CODE: 17  DESC: "


class NameServerRemoting:
    def __init__(self, ns: NameServer):
        self.ns = ns
        self.server: RemotingServer | None = None

    async def start(self, listen: str, server_tls: ServerTls = TLS_OFF, guard: RemotingGuard | None = None) -> str:
        self.server = RemotingServer(listen, {
            Request.GET_ROUTEINFO_BY_TOPIC: self.route,
            Request.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            Request.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list,
            Request.DELETE_TOPIC_IN_NAMESRV: self.forget_topic,
        }, "NameServer", tls=server_tls, authorize=guard)
        return await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()

    async def route(self, conn: Connection, request: Command) -> Command:
        topic = request.ext.get("topic", "")
        if not topic:
            raise RemotingError("GET_ROUTEINFO_BY_TOPIC lacks header field topic", Response.INVALID_PARAMETER)
        try:
            await self.ns.query_route(topic)  # the one rule: unknown topic, auto-creation, names
        except TopicNotFoundError as exc:
            # the 4.x client adds "CODE: 17  DESC: " itself
            return request.response(Response.TOPIC_NOT_EXIST, exc.message.removeprefix(REMOTING_CODE_PREFIX))
        route = self.ns.registry.remoting_route(topic, now_ms=self.ns.clock_ms())
        if not route:
            return request.response(Response.TOPIC_NOT_EXIST, (
                f"No topic route info in name server for the topic: {topic}; the broker groups that have it serve no "
                "Remoting door (remotingPort=0, or a replica of an older version)"))
        return request.response(Response.SUCCESS, body=_json(route))

    async def cluster_info(self, conn: Connection, request: Command) -> Command:
        info = self.ns.registry.remoting_cluster_info(self.ns.clock_ms())
        return request.response(Response.SUCCESS, body=_json(info))

    async def topic_list(self, conn: Connection, request: Command) -> Command:
        topics = sorted({t.name for reg, _ in self.ns.registry.heard(self.ns.clock_ms()) for t in reg.topics})
        return request.response(Response.SUCCESS, body=_json({"topicList": topics}))


    async def forget_topic(self, conn: Connection, request: Command) -> Command:
        """mqadmin deleteTopic, after it deleted the topic on each broker group: routes drop it now, not at the
        brokers' next registration."""
        topic = request.ext.get("topic", "")
        if not topic:
            raise RemotingError("DELETE_TOPIC_IN_NAMESRV lacks header field topic", Response.INVALID_PARAMETER)
        for group in self.ns.registry.groups(self.ns.clock_ms()):
            self.ns.registry.remove_topic(group, topic, self.ns.clock_ms())
        return request.response(Response.SUCCESS)


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
