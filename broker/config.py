"""Broker configuration: one typed object, loaded from a TOML file, then the environment, then flags.

Keys use RocketMQ's names where RocketMQ has one (brokerName, namesrvAddr, flushDiskType, ...), so a
RocketMQ operator recognises them. Environment: ROCKETRAFT_<NAME_IN_UPPER_SNAKE> (ROCKETRAFT_BROKER_NAME).
Flags: --<rocketmqName> (--brokerName). Later sources override earlier ones.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field

import dledger
from rocketraft.protocol import auth_acl, auth_internal, limits, tls
from rocketraft.protocol.limits import DELAY_LEVELS
from serverkit import auth_guard, configfile
from serverkit.serverkeys import SecurityKeys

STORE_MAP_SIZE_BYTES_MIN = 16 * 1024 * 1024
ENTRY_OVERHEAD_BYTES = 64 * 1024  # a send command's fields around the message, and the batch header
_DLEDGER = dledger.ReplicaConfig  # its class attributes are dledger's defaults
WRITE_RETRY_MILLIS_MAX = 60_000
MESSAGE_SIZE_MAX = 64 * 1024 * 1024  # maxMessageSize's ceiling: one message is one Raft payload, sent whole
PROPERTIES_BYTES_MIN = 64  # messagePropertiesBytesMax's floor: room for the routing properties (QUEUE_ID, DELAY)
PROPERTIES_BYTES_LIMIT = 1024 * 1024  # and its ceiling
SHUTDOWN_TRANSFER_MILLIS_MAX = 60_000
METRICS_PORT_DEFAULT = 5557  # RocketMQ 5's metricsPromExporterPort
PORT_MAX = 65_535
REMOTING_PORT_OFFSET = limits.REMOTING_BROKER_PORT_DEFAULT - 8081  # gRPC 8081 -> Remoting 10911, as RocketMQ
FILE_RESERVED_HOURS_MAX = 24 * 365 * 100
CLOCK_SKEW_BOUND_MS_MIN = 10
CLOCK_SKEW_BOUND_MS_MAX = 3_600_000
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
RAFT_PASSWORD_LABEL = b"rocketraft dledger password v1"  # HMAC(cluster secret, label) = the default Raft password

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    levels = []
    for item in text.split():
        m = re.fullmatch(r"(\d+)([smhd])", item)
        if not m:
            raise ValueError(f"messageDelayLevel item {item!r} is not <number><s|m|h|d>")
        levels.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    return tuple(levels)


@dataclass
class BrokerConfig(SecurityKeys):
    brokerClusterName: str = "DefaultCluster"
    brokerName: str = "broker-a"  # the broker group = one Raft group
    # dledger: this replica's id and every replica of the group as "id-host:port;id-host:port" (Raft addresses)
    dLegerSelfId: str = "n0"
    dLegerPeers: str = "n0-127.0.0.1:40911"
    namesrvAddr: str = "127.0.0.1:9876"  # ";"-separated; the broker registers with every one
    listenAddress: str = "127.0.0.1:8081"  # gRPC: MessagingService (clients) and BrokerAdmin
    advertisedAddress: str = ""  # what clients are told (brokerIP1:port); default listenAddress
    # what the NameServers dial (BrokerAdmin, BrokerAuth, RecallMessage) when they cannot reach advertisedAddress,
    # e.g. the service name in a compose network while clients use a published port; default advertisedAddress
    internalAddress: str = ""
    storePathRootDir: str = os.path.expanduser("~/rocketraft/store")
    flushDiskType: str = "ASYNC_FLUSH"  # or SYNC_FLUSH; see docs/architecture.md for what an ack means
    flushIntervalCommitLog: int = _DLEDGER.async_flush_interval_ms  # ASYNC_FLUSH: fsync the Raft log this often
    # dledger (the group's Raft): docs/broker.md, "Raft settings", names the dledger field each one sets
    dLegerPassword: str = ""  # encrypts and authenticates Raft traffic; "" = none. The same on every replica
    dLegerHeartBeatTimeIntervalMs: int = _DLEDGER.heartbeat_interval_ms
    dLegerElectionTimeoutMinMs: int = _DLEDGER.election_timeout_min_ms
    dLegerElectionTimeoutMaxMs: int = _DLEDGER.election_timeout_max_ms
    dLegerLeaderFallbackTimeoutMs: int = 0  # a master that hears from no majority this long steps down; 0 = min
    dLegerMaxWaitAckTimeMs: int = _DLEDGER.append_timeout_ms  # then a write's outcome is unknown (PROXY_TIMEOUT)
    # a replica on a new store votes at once instead of after catching up: only to restart a group that lost a
    # majority of its disks from the survivors (docs/operations.md, "Replace a replica's disk")
    dLegerJoinAsVoter: bool = False
    # LMDB map of the replica's store: address space reserved, not disk used; the store cannot grow past it
    storeMapSizeBytes: int = dledger.ReplicaConfig.map_size_bytes
    # a slave (follower) forwards writes to the master through Raft; false: it refuses them, naming the master
    slaveForwardEnable: bool = True
    # RocketMQ's key: 4.x consumers pull from followers. The master's pull answers suggest a follower
    # (suggestWhichBrokerId, one per group and queue), which then keeps the consumer; a follower never answers past
    # what it has applied, and sends a consumer that is ahead of it back to the master (docs/client.md)
    slaveReadEnable: bool = False
    # limits
    maxMessageSize: int = limits.BODY_BYTES_MAX
    messagePropertiesBytesMax: int = limits.PROPERTIES_BYTES_MAX
    # a send is refused if its message, as delivered, would exceed this gRPC message size (the SDKs' receive limit);
    # 0: no such check (limits.DELIVERY_FRAME_BYTES_MAX)
    deliveryFrameBytesMax: int = limits.DELIVERY_FRAME_BYTES_MAX
    diskMaxUsedSpaceRatio: int = 75
    diskCheckIntervalMs: int = 1000
    # sends are refused once this replica's LMDB map (storeMapSizeBytes) is more than this percent used, so
    # the replicas (whose usage is nearly equal) never reach MDB_MAP_FULL, which stops their Raft engines
    storeMapMaxUsedRatio: int = 90
    waitTimeMillsInSendQueue: int = 200
    sendQueueLengthMax: int = 20_000
    batchBytesMax: int = 1024 * 1024  # one Raft entry carries at most this many payload bytes
    batchCommandsMax: int = 1024
    appendsInFlightMax: int = 8  # Raft entries in flight from this replica's batcher
    # a write refused for want of a leader (an election), or a send whose outcome is unknown, is retried for up
    # to this long before the client is answered (inside the SDKs' 3 s request timeout)
    writeRetryMillis: int = 2_500
    # topics and groups
    autoCreateTopicEnable: bool = False
    autoCreateSubscriptionGroup: bool = True  # RocketMQ's key: every group exists with the defaults; false is refused
    defaultTopicQueueNums: int = limits.QUEUES_PER_TOPIC_DEFAULT
    topicQueueNumsMax: int = limits.QUEUE_NUMS_MAX
    maxReconsumeTimes: int = limits.MAX_RECONSUME_TIMES  # delivery attempts = maxReconsumeTimes + 1, then %DLQ%<group>
    # consumption
    # a receive with auto_renew (the official SDKs' push consumers) makes its messages invisible this long, and the
    # replica that served it renews them while the client lives (broker/renewal.py; RocketMQ 5 proxy's names and
    # defaults): it looks every renewSchedulePeriodMillis, renews a message renewAheadTimeMillis before its
    # invisibility ends, for another defaultInvisibleTimeMillis, at most renewMaxTimeMillis after its receive; a
    # client that is gone gets its messages back after invisibleTimeMillisWhenClear. enableProxyAutoRenew=false:
    # no renewal (the invisibility stays defaultInvisibleTimeMillis)
    defaultInvisibleTimeMillis: int = 60_000
    enableProxyAutoRenew: bool = True
    renewSchedulePeriodMillis: int = 5_000
    renewAheadTimeMillis: int = 10_000
    renewMaxTimeMillis: int = 3 * 3_600_000
    invisibleTimeMillisWhenClear: int = 1_000
    renewHandlesMax: int = 20_000  # messages one replica renews at once; an auto_renew receive beyond is refused
    invisibleTimeMillisMin: int = limits.INVISIBLE_MS_MIN
    invisibleTimeMillisMax: int = limits.INVISIBLE_MS_MAX
    longPollingTimeoutMillisMax: int = limits.LONG_POLLING_MS_MAX
    receiveBatchSizeMax: int = limits.RECEIVE_BATCH_SIZE_MAX
    popScanOffsetsMax: int = 2048  # offsets one pop looks at per queue (filtered-out messages count)
    # delayed and transactional messages
    messageDelayLevel: str = DELAY_LEVELS
    timerMaxDelayMillis: int = limits.DELIVERY_DELAY_MS_MAX
    timerCheckIntervalMillis: int = 100
    transactionTimeOut: int = 6_000  # a half message older than this is checked back
    transactionCheckInterval: int = 30_000
    transactionCheckMax: int = 15  # then rolled back
    # message retention (docs/broker.md, "Retention"): the master deletes, on every replica at once through Raft,
    # messages stored more than fileReservedTime hours ago (RocketMQ's key and unit; fractions allowed, e.g.
    # 0.001 = 3.6 s), checking every cleanResourceInterval ms, and the oldest messages whatever their age while the
    # store's filesystem (net of LMDB's reusable pages) is above diskSpaceCleanForciblyRatio or its LMDB map above
    # storeMapCleanForciblyRatio (both below the ratios at which sends are refused, so cleanup comes first)
    fileReservedTime: float = 72.0
    cleanResourceInterval: int = 10_000
    cleanFileForciblyEnable: bool = True  # false: only fileReservedTime deletes (space never forces a cleanup)
    diskSpaceCleanForciblyRatio: int = 70
    storeMapCleanForciblyRatio: int = 80
    # consume-queue entries one retention command deletes: one apply on every replica's Raft thread (~8 us each)
    cleanMessagesPerCommandMax: int = 2_000
    # Group time (docs/operations.md, "Clocks"): every time the broker stamps or acts on is the group's, bounded by a
    # majority of the replicas' clocks (dledger/groupclock.py). A replica whose own wall clock is further than this
    # from it is out of bound: its status, metrics and log say so, and as master it deletes nothing by time.
    clockSkewBoundMillis: int = _DLEDGER.clock_skew_bound_ms
    # Raft log compaction (dledger): the log prefix below the retention floor is compacted (a snapshot, then the
    # prefix deleted) once this many entries can go, at most once per interval
    dLegerCompactionMinEntries: int = _DLEDGER.compaction_min_entries
    dLegerCompactionMinIntervalMs: int = _DLEDGER.compaction_min_interval_ms
    # NameServer registration
    heartbeatIntervalMillis: int = 1_000
    heartbeatTimeoutMillis: int = 3_000  # NameServers drop this replica after this silence
    # SIGTERM on the master: hand leadership to an up-to-date replica, waiting at most this long (0 = no handover:
    # stop at once, the group elects a new master), then stop (docs/operations.md, "Graceful stop")
    shutdownTransferLeaderTimeoutMillis: int = 3_000
    # clients
    clientExpiryMillis: int = 30_000  # a client silent this long is forgotten (subscriptions, streams)
    clientsMax: int = 10_000  # live clients one replica tracks; a new one beyond is refused (TOO_MANY_REQUESTS)
    rpcsInFlightMax: int = limits.RPCS_IN_FLIGHT_MAX  # RPCs served at once; one more gets RESOURCE_EXHAUSTED
    connectionIdleMillis: int = limits.CONNECTION_IDLE_MS  # a connection with no RPC this long is closed
    connectionsMax: int = limits.CONNECTIONS_MAX  # connections held at once; one more is closed before its handshake
    # Prometheus metrics over HTTP (GET /metrics; docs/metrics.md): RocketMQ 5's port; 0 = off
    metricsPort: int = METRICS_PORT_DEFAULT
    metricsListenHost: str = ""  # "" = the host of listenAddress
    # RocketMQ's Remoting protocol for 4.x clients (docs/client.md, "RocketMQ 4.x clients"), on the host of
    # listenAddress: -1 = the gRPC port + 2830 (8081 -> 10911, RocketMQ's broker port); 0 = off
    remotingPort: int = -1
    # internal calls (registration, BrokerAdmin, user and ACL admin) must prove this secret (docs/security.md);
    # "" = none: internal traffic is unauthenticated. Prefer ROCKETRAFT_CLUSTER_SECRET or clusterSecretFile
    # to a flag (a flag shows in `ps`). The same on every broker and NameServer of the cluster
    clusterSecret: str = field(default="", repr=False)
    clusterSecretFile: str = ""
    clusterAuthWindowMillis: int = auth_internal.WINDOW_MS_DEFAULT  # clock difference accepted; replay memory
    # a proof of the secret is valid only at the server it was made for ("host:port" as its caller dialed): this
    # broker answers to its listen, advertised and internal addresses, and to these (";"-separated host:port: a DNS
    # name or published port callers use; docs/security.md, "The cluster secret")
    clusterAuthAudiences: str = ""
    # accept proofs in the format before 2026-11-27 (not bound to a request or server) during a rolling upgrade
    clusterAuthLegacyProofs: bool = False
    # ACL 2.0 (docs/security.md): clients must sign their calls as a user (needs a cluster secret), and with
    # authorization a NORMAL user may only do what its ACL allows
    authenticationEnabled: bool = False
    authorizationEnabled: bool = False
    authenticationWindowMillis: int = auth_acl.AUTH_WINDOW_MS_DEFAULT  # a signed x-mq-date-time this old is refused
    authenticationAnyTimezone: bool = False  # accept the SDKs' local time "Z" from any timezone, not only UTC/ours
    # TLS on listenAddress (docs/security.md, "TLS"): disabled | permissive (TLS and plaintext on one port) |
    # enforcing; certificate chain and key (PEM); the CA that verifies the servers this broker calls (and, with
    # tlsClientAuth require, its callers)
    tlsMode: str = tls.DISABLED
    tlsCertFile: str = ""
    tlsKeyFile: str = ""
    tlsCaFile: str = ""
    tlsClientAuth: str = tls.CLIENT_AUTH_NONE  # or require: every caller presents a certificate (mTLS)
    logLevel: str = "INFO"

    # -- derived ------------------------------------------------------------------------------------
    @property
    def peers(self) -> dict[str, str]:
        out = {}
        for item in filter(None, (p.strip() for p in self.dLegerPeers.split(";"))):
            peer_id, sep, address = item.partition("-")
            if not sep or not peer_id or ":" not in address:
                raise ValueError(f"dLegerPeers item {item!r} is not id-host:port (e.g. n0-127.0.0.1:40911)")
            out[peer_id] = address
        return out

    @property
    def namesrv_addresses(self) -> list[str]:
        return [a.strip() for a in self.namesrvAddr.split(";") if a.strip()]

    @property
    def advertised(self) -> str:
        return self.advertisedAddress or self.listenAddress

    @property
    def remoting_listen(self) -> str | None:
        """host:port of the Remoting door; None when remotingPort is 0 (off)."""
        if not self.remotingPort:
            return None
        host, _, port = self.listenAddress.rpartition(":")
        return f"{host}:{self.remoting_port(int(port))}"

    def remoting_port(self, grpc_port: int) -> int:
        """The Remoting port for this gRPC port (0 with gRPC's 0: a free port)."""
        if self.remotingPort != -1:
            return self.remotingPort
        return grpc_port + REMOTING_PORT_OFFSET if grpc_port else 0

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) the metrics HTTP server listens on; None when metricsPort is 0 (off)."""
        if not self.metricsPort:
            return None
        return self.metricsListenHost or self.listenAddress.rpartition(":")[0].strip("[]"), self.metricsPort

    @property
    def follower_broker_id(self) -> int:
        """Stable brokerId (>= 1) of this replica while it is not master: its rank in dLegerPeers."""
        return self.broker_id_of(self.dLegerSelfId)

    def broker_id_of(self, replica_id: str) -> int:
        """The brokerId a member of dLegerPeers registers with while it is not master: its rank there (>= 1)."""
        return sorted(self.peers).index(replica_id) + 1

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.messageDelayLevel)

    @property
    def max_delivery_attempts(self) -> int:
        return self.maxReconsumeTimes + 1

    @property
    def data_dir(self) -> str:
        return os.path.join(self.storePathRootDir, self.brokerName, self.dLegerSelfId)

    def replica_config(self) -> dledger.ReplicaConfig:
        """This replica's dledger configuration."""
        return dledger.ReplicaConfig(
            group_id=self.brokerName, self_id=self.dLegerSelfId, peers=self.peers,
            data_dir=os.path.join(self.data_dir, "dledger"),
            flush_policy=dledger.FlushPolicy[self.flushDiskType], map_size_bytes=self.storeMapSizeBytes,
            async_flush_interval_ms=self.flushIntervalCommitLog, password=self.raft_password,
            heartbeat_interval_ms=self.dLegerHeartBeatTimeIntervalMs,
            election_timeout_min_ms=self.dLegerElectionTimeoutMinMs,
            election_timeout_max_ms=self.dLegerElectionTimeoutMaxMs,
            leader_fallback_timeout_ms=self.dLegerLeaderFallbackTimeoutMs or None,
            append_timeout_ms=self.dLegerMaxWaitAckTimeMs, entry_bytes_max=self.entry_bytes_max,
            join_as_voter=self.dLegerJoinAsVoter, compaction_min_entries=self.dLegerCompactionMinEntries,
            compaction_min_interval_ms=self.dLegerCompactionMinIntervalMs,
            clock_skew_bound_ms=self.clockSkewBoundMillis)

    @property
    def entry_bytes_max(self) -> int:
        """The largest Raft entry this broker builds: a batch (batchBytesMax), or one message as large as
        maxMessageSize with its properties, plus the command's own fields."""
        largest = max(self.batchBytesMax, self.maxMessageSize + self.messagePropertiesBytesMax)
        return max(dledger.config.ENTRY_BYTES_MAX_DEFAULT, largest + ENTRY_OVERHEAD_BYTES)

    def validate(self) -> BrokerConfig:
        peers = self.peers
        if self.dLegerSelfId not in peers:
            raise ValueError(f"dLegerSelfId {self.dLegerSelfId!r} is not in dLegerPeers ({', '.join(peers)})")
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", self.brokerName):
            raise ValueError(f"brokerName {self.brokerName!r}: use 1-64 of [a-zA-Z0-9_-]")
        if self.flushDiskType not in ("SYNC_FLUSH", "ASYNC_FLUSH"):
            raise ValueError(f"flushDiskType {self.flushDiskType!r}: use SYNC_FLUSH or ASYNC_FLUSH")
        if self.storeMapSizeBytes < STORE_MAP_SIZE_BYTES_MIN:
            raise ValueError(f"storeMapSizeBytes {self.storeMapSizeBytes}: use at least {STORE_MAP_SIZE_BYTES_MIN} "
                             "(16 MiB); it reserves address space, not disk, so the default (1 TiB) is fine")
        if not 1 <= self.diskMaxUsedSpaceRatio <= 99:
            raise ValueError(f"diskMaxUsedSpaceRatio {self.diskMaxUsedSpaceRatio}: use 1..99 (percent)")
        if not 1 <= self.storeMapMaxUsedRatio <= 99:
            raise ValueError(f"storeMapMaxUsedRatio {self.storeMapMaxUsedRatio}: use 1..99 (percent of "
                             "storeMapSizeBytes)")
        if not 0 <= self.writeRetryMillis <= WRITE_RETRY_MILLIS_MAX:
            raise ValueError(f"writeRetryMillis {self.writeRetryMillis}: use 0..{WRITE_RETRY_MILLIS_MAX} (ms; 0 = "
                             "answer at once, no retry)")
        if not 1 <= self.topicQueueNumsMax <= limits.QUEUE_NUMS_MAX:
            raise ValueError(f"topicQueueNumsMax {self.topicQueueNumsMax}: use 1..{limits.QUEUE_NUMS_MAX} (the "
                             "NameServers route at most that many queues of a topic per group, and refuse a "
                             "topic with more)")
        if not 1 <= self.defaultTopicQueueNums <= self.topicQueueNumsMax:
            raise ValueError(f"defaultTopicQueueNums {self.defaultTopicQueueNums}: use 1..{self.topicQueueNumsMax}")
        if not self.namesrv_addresses:
            raise ValueError("namesrvAddr is empty: give at least one NameServer host:port")
        self._validate_metrics()
        self._validate_remoting()
        self._validate_retention()
        self.delay_levels_ms  # noqa: B018 - validates the format
        self._validate_raft()
        self._validate_client_limits()
        self._validate_renewal()
        self._validate_auth()
        self._validate_counts()
        self._validate_registration()
        if not self.autoCreateSubscriptionGroup:
            raise ValueError("autoCreateSubscriptionGroup false: not supported; every consumer group exists with the "
                             "brokers' defaults until it is created with other settings. To keep clients to the "
                             "groups you allow, use ACL 2.0 (authorizationEnabled; docs/security.md)")
        if self.logLevel.upper() not in LOG_LEVELS:
            raise ValueError(f"logLevel {self.logLevel!r}: use one of {', '.join(LOG_LEVELS)}")
        return self

    def _validate_counts(self) -> None:
        """Sizes and periods that 0 (or less) would break: a batcher with no append in flight never sends, a
        check every 0 ms spins."""
        for key in ("appendsInFlightMax", "sendQueueLengthMax", "batchBytesMax", "batchCommandsMax",
                    "waitTimeMillsInSendQueue", "diskCheckIntervalMs", "popScanOffsetsMax", "timerMaxDelayMillis",
                    "timerCheckIntervalMillis", "transactionTimeOut", "transactionCheckInterval",
                    "transactionCheckMax", "clientExpiryMillis", "longPollingTimeoutMillisMax",
                    "receiveBatchSizeMax"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} {getattr(self, key)}: use at least 1")
        if self.maxReconsumeTimes < 0:
            raise ValueError(f"maxReconsumeTimes {self.maxReconsumeTimes}: use 0 or more (delivery attempts = "
                             "maxReconsumeTimes + 1, then the message goes to %DLQ%<group>)")

    def _validate_registration(self) -> None:
        for key, value in (("advertisedAddress", self.advertisedAddress), ("internalAddress", self.internalAddress),
                           *(("clusterAuthAudiences", a) for a in self.cluster_auth_audiences)):
            host, sep, port = value.rpartition(":")
            if value and not (sep and host and port.isdigit() and 0 < int(port) <= PORT_MAX):
                raise ValueError(f"{key} {value!r} is not host:port (e.g. broker-n0:8081)")
        interval, timeout = self.heartbeatIntervalMillis, self.heartbeatTimeoutMillis
        if not 1 <= timeout <= limits.HEARTBEAT_TIMEOUT_MS_MAX:
            raise ValueError(f"heartbeatTimeoutMillis {timeout}: use 1..{limits.HEARTBEAT_TIMEOUT_MS_MAX} (ms; the "
                             "NameServers refuse a registration asking for more)")
        if not 1 <= interval < timeout:
            raise ValueError(f"heartbeatIntervalMillis {interval}: use 1..{timeout - 1} (ms; below "
                             f"heartbeatTimeoutMillis={timeout}, or the NameServers drop this replica between two "
                             "heartbeats)")

    def _validate_client_limits(self) -> None:
        for key in ("clientsMax", "rpcsInFlightMax", "connectionIdleMillis", "connectionsMax"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} {getattr(self, key)}: use at least 1")
        if not 1 <= self.maxMessageSize <= MESSAGE_SIZE_MAX:
            raise ValueError(f"maxMessageSize {self.maxMessageSize}: use 1..{MESSAGE_SIZE_MAX} (bytes of a body)")
        if self.deliveryFrameBytesMax and not 65_536 <= self.deliveryFrameBytesMax <= MESSAGE_SIZE_MAX * 2:
            raise ValueError(f"deliveryFrameBytesMax {self.deliveryFrameBytesMax}: use 0 (no check) or "
                             f"65536..{MESSAGE_SIZE_MAX * 2} (bytes of a delivered message)")
        if not PROPERTIES_BYTES_MIN <= self.messagePropertiesBytesMax <= PROPERTIES_BYTES_LIMIT:
            raise ValueError(f"messagePropertiesBytesMax {self.messagePropertiesBytesMax}: use {PROPERTIES_BYTES_MIN}.."
                             f"{PROPERTIES_BYTES_LIMIT} (bytes of a message's user properties; at least room for the "
                             "routing properties producers add)")

    def _validate_renewal(self) -> None:
        low, high = self.invisibleTimeMillisMin, self.invisibleTimeMillisMax
        if not low <= self.defaultInvisibleTimeMillis <= high:
            raise ValueError(f"defaultInvisibleTimeMillis {self.defaultInvisibleTimeMillis}: use {low}..{high} (ms: "
                             "invisibleTimeMillisMin..invisibleTimeMillisMax)")
        for key in ("renewMaxTimeMillis", "invisibleTimeMillisWhenClear"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} {getattr(self, key)}: use 0 or more (ms)")
        if self.renewHandlesMax < 1:
            raise ValueError(f"renewHandlesMax {self.renewHandlesMax}: use at least 1")
        period, ahead = self.renewSchedulePeriodMillis, self.renewAheadTimeMillis
        if self.enableProxyAutoRenew and not 1 <= period < ahead < self.defaultInvisibleTimeMillis:
            raise ValueError(
                f"renewSchedulePeriodMillis {period}, renewAheadTimeMillis {ahead}, defaultInvisibleTimeMillis "
                f"{self.defaultInvisibleTimeMillis}: each must be larger than the one before (and the period at least "
                "1 ms): a message is looked at every period and renewed once its invisibility ends within the ahead "
                "time, so a period as long as the ahead time could miss it, and an ahead time as long as the "
                "invisibility would renew every message at every look (or set enableProxyAutoRenew = false)")

    def _validate_remoting(self) -> None:
        if not -1 <= self.remotingPort <= PORT_MAX:
            raise ValueError(f"remotingPort {self.remotingPort}: use a port 1..{PORT_MAX}, -1 (the gRPC port + "
                             f"{REMOTING_PORT_OFFSET}) or 0 (no Remoting door)")
        listen = self.remoting_listen
        if listen is None:
            return
        port = int(listen.rpartition(":")[2])
        if not 0 <= port <= PORT_MAX:
            raise ValueError(f"remotingPort -1 derives port {port} from listenAddress {self.listenAddress}, which is "
                             f"not a port: set remotingPort")
        if listen == self.listenAddress or port == self.metricsPort:
            raise ValueError(f"remotingPort: {listen} is used by gRPC or metrics already; give it a port of its own")

    def _validate_metrics(self) -> None:
        if not 0 <= self.metricsPort <= PORT_MAX:
            raise ValueError(f"metricsPort {self.metricsPort}: use 0 (metrics off) or a port 1..{PORT_MAX} "
                             f"(RocketMQ 5's default is {METRICS_PORT_DEFAULT})")
        address = self.metrics_address
        if address is not None and f"{address[0]}:{address[1]}" == self.listenAddress:
            raise ValueError(f"metricsPort {self.metricsPort}: listenAddress {self.listenAddress} uses it already; "
                             "give metrics a port of their own")
        if any(c.isspace() or c in "/[]" for c in self.metricsListenHost):
            raise ValueError(f"metricsListenHost {self.metricsListenHost!r}: give a host name or IP address "
                             "(\"\" = the host of listenAddress)")

    @property
    def raft_password(self) -> str | None:
        """dLegerPassword, else one derived from the cluster secret (so a cluster with a secret never has an
        unauthenticated Raft port), else None."""
        secret = self.cluster_secret
        if self.dLegerPassword or not secret:
            return self.dLegerPassword or None
        return hmac.new(secret.encode(), RAFT_PASSWORD_LABEL, hashlib.sha256).hexdigest()

    def _validate_tls(self) -> None:
        try:
            self.server_tls.validate()
        except tls.TlsError as exc:
            raise ValueError(str(exc)) from None
        if self.server_tls.on and self.raft_password is None:
            raise ValueError(f"tlsMode {self.tlsMode}: the Raft port would still take unauthenticated peers; set "
                             "clusterSecret (the Raft password is then derived from it) or dLegerPassword")

    def _validate_auth(self) -> None:
        try:
            self.cluster_secret  # noqa: B018 - reads the file, checks the length
        except auth_internal.SecretError as exc:
            raise ValueError(f"clusterSecret: {exc}") from None
        self._validate_tls()
        if self.clusterAuthWindowMillis < 1:
            raise ValueError(f"clusterAuthWindowMillis {self.clusterAuthWindowMillis}: use at least 1 (ms)")
        auth_guard.check_config(self.guard_config, self.cluster_secret)

    @property
    def file_reserved_ms(self) -> int:
        return round(self.fileReservedTime * 3_600_000)

    def _validate_retention(self) -> None:
        if not (0 < self.fileReservedTime <= FILE_RESERVED_HOURS_MAX) or self.file_reserved_ms < 1:
            raise ValueError(f"fileReservedTime {self.fileReservedTime}: use hours in (0, {FILE_RESERVED_HOURS_MAX}] "
                             "(fractions allowed: 0.001 = 3.6 s; at least 1 ms)")
        if not CLOCK_SKEW_BOUND_MS_MIN <= self.clockSkewBoundMillis <= CLOCK_SKEW_BOUND_MS_MAX:
            raise ValueError(f"clockSkewBoundMillis {self.clockSkewBoundMillis}: use {CLOCK_SKEW_BOUND_MS_MIN}.."
                             f"{CLOCK_SKEW_BOUND_MS_MAX} (ms; NTP keeps clocks within a few ms, so 1000 leaves room)")
        if self.cleanResourceInterval < 1:
            raise ValueError(f"cleanResourceInterval {self.cleanResourceInterval}: use at least 1 (ms)")
        for clean_key, refuse_key, of in (("diskSpaceCleanForciblyRatio", "diskMaxUsedSpaceRatio", "percent"),
                                          ("storeMapCleanForciblyRatio", "storeMapMaxUsedRatio",
                                           "percent of storeMapSizeBytes")):
            clean, refuse = getattr(self, clean_key), getattr(self, refuse_key)
            if not 1 <= clean <= 99:
                raise ValueError(f"{clean_key} {clean}: use 1..99 ({of}; below {refuse_key}={refuse} so the oldest "
                                 "messages are deleted before sends are refused)")
            if self.cleanFileForciblyEnable and clean >= refuse:
                raise ValueError(f"{clean_key} {clean}: a forced cleanup would start only above {refuse_key}={refuse}, "
                                 "where sends are refused already, so none would ever start; set "
                                 f"{clean_key} below {refuse} (or cleanFileForciblyEnable = false)")
        if self.cleanMessagesPerCommandMax < 1:
            raise ValueError(f"cleanMessagesPerCommandMax {self.cleanMessagesPerCommandMax}: use at least 1")
        if self.dLegerCompactionMinEntries < 1:
            raise ValueError(f"dLegerCompactionMinEntries {self.dLegerCompactionMinEntries}: use at least 1")
        if self.dLegerCompactionMinIntervalMs < 0:
            raise ValueError(f"dLegerCompactionMinIntervalMs {self.dLegerCompactionMinIntervalMs}: use 0 or more (ms)")

    def _validate_raft(self) -> None:
        heartbeat, low, high = (self.dLegerHeartBeatTimeIntervalMs, self.dLegerElectionTimeoutMinMs,
                                self.dLegerElectionTimeoutMaxMs)
        if heartbeat < 1:
            raise ValueError(f"dLegerHeartBeatTimeIntervalMs {heartbeat}: use at least 1 (ms)")
        if low <= 3 * heartbeat:
            raise ValueError(f"dLegerElectionTimeoutMinMs {low}: must exceed 3 x dLegerHeartBeatTimeIntervalMs "
                             f"({3 * heartbeat}), or followers start elections between heartbeats")
        if high <= low:
            raise ValueError(f"dLegerElectionTimeoutMaxMs {high}: must exceed dLegerElectionTimeoutMinMs ({low})")
        fallback = self.dLegerLeaderFallbackTimeoutMs
        if fallback < 0 or 0 < fallback <= heartbeat:
            raise ValueError(f"dLegerLeaderFallbackTimeoutMs {fallback}: use 0 (= dLegerElectionTimeoutMinMs) or "
                             f"more than dLegerHeartBeatTimeIntervalMs ({heartbeat})")
        if self.dLegerMaxWaitAckTimeMs < 1:
            raise ValueError(f"dLegerMaxWaitAckTimeMs {self.dLegerMaxWaitAckTimeMs}: use at least 1 (ms)")
        if self.flushIntervalCommitLog < 1:
            raise ValueError(f"flushIntervalCommitLog {self.flushIntervalCommitLog}: use at least 1 (ms)")
        if not 0 <= self.shutdownTransferLeaderTimeoutMillis <= SHUTDOWN_TRANSFER_MILLIS_MAX:
            raise ValueError(f"shutdownTransferLeaderTimeoutMillis {self.shutdownTransferLeaderTimeoutMillis}: use "
                             f"0..{SHUTDOWN_TRANSFER_MILLIS_MAX} (ms; 0 = stop without handing leadership over)")
        self.replica_config()  # dledger's own checks, should one be missing here


def env_name(key: str) -> str:
    """ROCKETRAFT_<UPPER_SNAKE> (brokerName: ROCKETRAFT_BROKER_NAME); RocketMQ's "dLeger" prefix is one word
    (dLegerPassword: ROCKETRAFT_DLEGER_PASSWORD)."""
    return configfile.upper_snake_env(re.sub(r"^dLeger", "Dleger", key))


KEYS = configfile.ConfigKeys(BrokerConfig, "broker", 'rocketraft broker --help lists every key; docs/broker.md, '
                             '"Running"', env_name)


def load(path: str | None = None, overrides: dict | None = None, environ: dict | None = None) -> BrokerConfig:
    return KEYS.build(KEYS.from_file(path), KEYS.from_env(environ), overrides or {}).validate()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    KEYS.add_arguments(parser, "TOML file with broker settings (RocketMQ key names)")


def from_args(args: argparse.Namespace) -> BrokerConfig:
    return load(args.config, KEYS.from_flags(args))


def to_toml(config: BrokerConfig) -> str:
    return KEYS.to_toml(config)
