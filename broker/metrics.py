"""Prometheus metrics of one broker replica, on http://<metricsListenHost>:<metricsPort>/metrics (docs/metrics.md
lists each one).

Read when Prometheus scrapes, not counted as requests go by: the replica's Raft status and counters (dledger's
`Replica.status()`, `stats`, `fsync_latency()`, `appends_in_flight`, `retention_floor`), the send queue and the
guards, the clients this replica knows and, on the master only, the applied state: topics, consumer groups, where
each group stands on each queue (`Queries.state_view`), half and dead-lettered messages. That state is the same on
every replica of a group, so only the master exports it: summing over node_id (the broker group) is then right, as
with RocketMQ, whose slaves take no sends. What nothing stores (messages and bytes in and out, message sizes,
transaction outcomes) is counted on the request paths, by whichever replica served the request (broker/traffic.py).
"""

from __future__ import annotations

import time

import dledger
from rocketraft.protocol.wire import Code, pb
from serverkit import metrics as m

from .clients import ClientRegistry
from .config import BrokerConfig
from .core import Broker
from .queries import Queries, StateView
from .renewal import Renewals
from .retention import Retention
from .traffic import MESSAGE_SIZE_BUCKETS_BYTES, RPC_LATENCY_BUCKETS_MS, Traffic

CONSUMPTION_QUEUES_MAX = 10_000  # queues one scrape reads the consumption of; more are left out (and said so)
MESSAGE_TYPES = {pb.MessageType.NORMAL: "Normal", pb.MessageType.FIFO: "FIFO", pb.MessageType.DELAY: "Delay",
                 pb.MessageType.TRANSACTION: "Transaction"}  # RocketMQ 5's message_type values
CONSUMER_TYPES = frozenset((pb.ClientType.PUSH_CONSUMER, pb.ClientType.SIMPLE_CONSUMER, pb.ClientType.PULL_CONSUMER,
                            pb.ClientType.LITE_PUSH_CONSUMER, pb.ClientType.LITE_SIMPLE_CONSUMER))
# dledger Replica.stats counters exported as they are: stats key -> (metric, what it counts)
RAFT_COUNTERS = {
    "leader_changes": ("rocketraft_raft_leader_changes_total", "leaders (leader id, term) this replica learned of "
                       "since it started, the first one included"),
    "elections_started": ("rocketraft_raft_elections_total", "elections this replica started (after a won "
                          "pre-vote)"),
    "prevote_rounds": ("rocketraft_raft_prevote_rounds_total", "pre-votes this replica asked for (its election "
                       "timer fired)"),
    "corrupt_found": ("rocketraft_raft_corrupt_entries_total", "entries of this store that failed their checksum"),
    "repaired": ("rocketraft_raft_repaired_entries_total", "corrupt entries replaced by a verified copy from a peer"),
    "lost": ("rocketraft_raft_lost_entries_total", "corrupt entries no peer had a good copy of"),
    "truncated_entries": ("rocketraft_raft_truncated_entries_total", "log entries deleted by a conflict with a new "
                          "leader's log"),
}


class BrokerCollector:
    def __init__(self, config: BrokerConfig, broker: Broker, queries: Queries, clients: ClientRegistry,
                 traffic: Traffic, retention: Retention, renewals: Renewals):
        self.config = config
        self.renewals = renewals
        self.broker = broker
        self.queries = queries
        self.clients = clients
        self.traffic = traffic
        self.retention = retention
        self._errors = [0]

    def collect(self):
        cfg = self.config
        families = m.Families((m.CLUSTER, m.NODE_TYPE, m.NODE_ID, m.REPLICA_ID),
                              (cfg.brokerClusterName, m.NODE_TYPE_BROKER, cfg.brokerName, cfg.dLegerSelfId))
        return m.safely(self._collect, families, self._errors, f"broker {cfg.brokerName}/{cfg.dLegerSelfId}")

    def _collect(self, f: m.Families) -> None:
        status = self.broker.status
        self._raft(f, status)
        self._node(f)
        self._renewals(f)
        self._retention(f)
        self._clock(f)
        self._traffic(f)
        if status.role is dledger.Role.LEADER and status.failure is None:
            self._state(f, self.queries.state_view(CONSUMPTION_QUEUES_MAX))

    # -- Raft (every replica) -----------------------------------------------------------------------------------
    def _raft(self, f: m.Families, st: dledger.ReplicaStatus) -> None:
        role = f.gauge("rocketraft_raft_role", "1 for this replica's current Raft role, 0 for the others "
                       "(LEADER = master; LEADER_PENDING = elected, first entry of its term not applied yet; "
                       "STOPPED = stopped after an error, rocketraft_raft_failure)", "role")
        for name in dledger.Role:
            role(1 if st.role is name else 0, name.value)
        replica = self.broker.replica
        for name, doc, value in (
                ("term", "current Raft term", st.term),
                ("commit_index", "highest log index known committed (on a majority)", st.commit_index),
                ("applied_index", "highest log index applied to the broker's tables", st.applied_index),
                ("first_index", "lowest log index still stored", st.first_index),
                ("last_index", "highest log index stored", st.last_index),
                ("durable_index", "highest log index fsynced on this replica", st.durable_index),
                ("retention_floor_index", "entries up to this index may be compacted away", replica.retention_floor),
                ("connected_peers", "peers this replica has a Raft connection with", len(st.connected_peers)),
                ("voter", "1 if this replica votes and counts toward quorums; 0 while its store catches up",
                 int(st.voter)),
                ("failure", "1 if the replica stopped after an error (its log says which); it serves nothing then",
                 int(st.failure is not None)),
                ("append_queue_length", "appends (Raft entries) this replica made that wait for their outcome",
                 replica.appends_in_flight)):
            f.gauge(f"rocketraft_raft_{name}", doc)(value)
        lag = f.gauge("rocketraft_raft_replication_lag_entries", "leader only: log entries a follower lacks "
                      "(last index - the follower's match index)", "follower")
        if st.role in (dledger.Role.LEADER, dledger.Role.LEADER_PENDING):
            for follower, match in sorted(st.peer_match_index.items()):
                lag(max(0, st.last_index - match), follower)
        stats = replica.stats
        for key, (name, doc) in RAFT_COUNTERS.items():
            f.counter(name, doc)(stats.get(key, 0))
        fsync = replica.fsync_latency()
        f.histogram("rocketraft_raft_fsync_seconds", "durable commits (SYNC_FLUSH: each synchronous LMDB commit, "
                    "write and fsyncs) or flusher fsyncs (ASYNC_FLUSH) of the store")(
            fsync.bounds_s, fsync.counts, fsync.sum_s)

    # -- this replica: queue, guards, disk, clients ------------------------------------------------------------
    def _node(self, f: m.Families) -> None:
        broker = self.broker
        f.gauge("rocketraft_send_queue_length", "commands waiting in this replica's send queue to be put into a "
                "Raft entry")(broker.batcher.queue_length)
        refused = f.counter("rocketraft_raft_fast_failures_total", "writes refused with TOO_MANY_REQUESTS (RocketMQ's "
                            "fast failure): waited longer than waitTimeMillsInSendQueue, or the send queue held "
                            "sendQueueLengthMax", "reason")
        refused(broker.batcher.stats.get("fast_failed", 0), "waited")
        refused(broker.batcher.stats.get("refused_queue_full", 0), "queue_full")
        f.gauge("rocketraft_raft_disk_used_ratio", "used fraction of the store's filesystem (writes are refused "
                "above diskMaxUsedSpaceRatio)")(broker.guards.disk.used_percent() / 100)
        f.gauge("rocketraft_raft_lmdb_map_used_ratio", "used fraction of the store's LMDB map, storeMapSizeBytes "
                "(writes are refused above storeMapMaxUsedRatio)")(
            broker.guards.map.measure() / broker.store.map_size_bytes)
        f.gauge("rocketmq_storage_size", "bytes of disk the replica's store files take")(broker.store.disk_bytes())
        producers = f.gauge("rocketmq_producer_connections", "producers this replica heard from within "
                            "clientExpiryMillis")
        consumers = f.gauge("rocketmq_consumer_connections", "consumers this replica heard from within "
                            "clientExpiryMillis", m.CONSUMER_GROUP)
        f.gauge("rocketraft_clients_known", "client sessions this replica holds, expired ones not yet forgotten "
                "included (new clients are refused at clientsMax)")(self.clients.known())
        f.gauge("rocketraft_telemetry_pending_bytes", "bytes of replies and check-backs this replica holds for client "
                "streams (Telemetry, 4.x connections) that their clients have not read yet (bounded per caller and in "
                "total: broker/outboxes.py)")(self.clients.outbox_budget.total)
        f.gauge("rocketraft_topic_waits", "topics that requests on this replica are waiting on right now (a long "
                "poll, a follower waiting for a new topic to arrive)")(broker.topics_waited_on())
        by_type = self.clients.live_by_group_and_type()
        producers(sum(n for (_, kind), n in by_type.items() if kind == pb.ClientType.PRODUCER))
        for (group, kind), n in sorted(by_type.items()):
            if kind in CONSUMER_TYPES:
                consumers(n, group)

    def _renewals(self, f: m.Families) -> None:
        r = self.renewals
        f.gauge("rocketraft_renewing_messages", "messages this replica keeps invisible for push consumers that "
                "received them with auto_renew (at most renewHandlesMax)")(r.held())
        outcomes = f.counter("rocketraft_renewals_total", "what this replica's renewals of auto_renew receives did: "
                             "renewed (a renewal committed), expired (renewMaxTimeMillis reached: delivered again), "
                             "released (its client is gone: visible again in invisibleTimeMillisWhenClear), stale "
                             "(acknowledged elsewhere or delivered again), refused (a receive refused at "
                             "renewHandlesMax)", "result")
        counts = r.counts
        for result in ("renewed", "expired", "released", "stale", "refused"):
            outcomes(getattr(counts, result), result)

    def _retention(self, f: m.Families) -> None:
        r = self.retention
        f.counter("rocketraft_retention_deleted_messages_total", "messages deleted by the retention commands this "
                  "replica proposed while master (fileReservedTime and forced cleanup)")(r.deleted_total)
        f.gauge("rocketraft_retention_forced_cleanup", "1 if this replica's last retention command, as master, "
                "forced a cleanup (disk or LMDB map above its forced-cleanup ratio)")(int(r.forced))
        f.gauge("rocketraft_retention_last_run_timestamp_seconds", "when this replica last committed a retention "
                "command as master (0: never)")(r.last_run_s)

    def _clock(self, f: m.Families) -> None:
        clock = self.broker.replica.clock()
        f.gauge("rocketraft_clock_group_time_seconds", "the group time on this replica (a majority of the replicas' "
                "clocks; 0 while none is known): what it stamps into and acts on in the replicated state")(
            clock.group_time_ms / 1000)
        f.gauge("rocketraft_clock_skew_seconds", "this replica's wall clock minus the group time (0 while none is "
                "known)")(clock.skew_ms / 1000)
        f.gauge("rocketraft_clock_in_bound", "1 if this replica's wall clock is within clockSkewBoundMillis of the "
                "group time; 0 if not, or if no group time from a majority of the clocks is known")(int(clock.in_bound))
        source = f.gauge("rocketraft_clock_source", "1 for where this replica's group time comes from: group (a "
                         "majority of the clocks), own clock (peers of an older version send none), none", "source")
        for name in dledger.ClockSource:
            source(int(clock.source is name), name.value)
        peers = f.gauge("rocketraft_clock_peer_skew_seconds", "leader only: a follower's wall clock minus the group "
                        "time, as measured over Raft's heartbeats", "peer")
        for peer, skew_ms in sorted(clock.peer_skew_ms.items()):
            peers(skew_ms / 1000, peer)
        r = self.retention
        f.counter("rocketraft_retention_time_refused_total", "retention decisions of this replica, as master, that "
                  "deleted nothing by time because its clock was out of bound or no group time was known")(
            r.time_refusals)

    # -- counted on the request paths of this replica -----------------------------------------------------------
    def _traffic(self, f: m.Families) -> None:
        messages_in = f.counter("rocketmq_messages_in_total", "messages stored from sends this replica received "
                                "(not duplicates of stored ones, nor refused or unknown outcomes)",
                                m.TOPIC, m.MESSAGE_TYPE)
        bytes_in = f.counter("rocketmq_throughput_in_total", "body bytes of those messages", m.TOPIC, m.MESSAGE_TYPE)
        sizes = f.histogram("rocketmq_message_size", "body bytes of those messages (RocketMQ 5's buckets)",
                            m.TOPIC, m.MESSAGE_TYPE)
        for (topic, kind), (counts, body_bytes) in sorted(self.traffic.stored_copy().items()):
            type_name = MESSAGE_TYPES.get(kind, str(kind))
            messages_in(sum(counts), topic, type_name)
            bytes_in(body_bytes, topic, type_name)
            sizes(MESSAGE_SIZE_BUCKETS_BYTES, counts, body_bytes, topic, type_name)
        messages_out = f.counter("rocketmq_messages_out_total", "messages this replica handed to consumers "
                                 "(ReceiveMessage and PullMessage; redeliveries included)", m.TOPIC, m.CONSUMER_GROUP)
        bytes_out = f.counter("rocketmq_throughput_out_total", "body bytes of those messages",
                              m.TOPIC, m.CONSUMER_GROUP)
        for (topic, group), (count, body_bytes) in sorted(self.traffic.delivered_copy().items()):
            messages_out(count, topic, group)
            bytes_out(body_bytes, topic, group)
        outcome = {True: f.counter("rocketmq_commit_messages_total", "transactions committed by requests this "
                                   "replica served", m.TOPIC),
                   False: f.counter("rocketmq_rollback_messages_total", "transactions rolled back by requests this "
                                    "replica served (the master's check-back rollbacks included)", m.TOPIC)}
        for (topic, committed), count in sorted(self.traffic.transactions_copy().items()):
            outcome[committed](count, topic)
        latency = f.histogram("rocketmq_rpc_latency", "milliseconds this replica took to answer unary "
                              "MessagingService calls (RocketMQ 5's buckets)", "protocol_type", "action", "result",
                              m.INVOCATION_STATUS)
        for (action, code), (counts, total_ms) in sorted(self.traffic.calls_copy().items()):
            latency(RPC_LATENCY_BUCKETS_MS, counts, total_ms, "grpc", action, Code.Name(code),
                    "success" if code == Code.OK else "failure")

    # -- the applied state (the master only) --------------------------------------------------------------------
    def _state(self, f: m.Families, view: StateView) -> None:
        f.gauge("rocketmq_topic_number", "topics on this broker group (%RETRY% and %DLQ% topics included)")(
            len(view.queue_nums))
        f.gauge("rocketmq_consumer_group_number", "consumer groups created on this broker group or with consumer "
                "state on it")(len(view.groups))
        f.gauge("rocketmq_half_messages", "transactional half messages waiting for their outcome")(view.half_messages)
        dlq = f.counter("rocketmq_send_to_dlq_messages_total", "messages put into the group's %DLQ% topic (after "
                        "maxReconsumeTimes, or by ForwardMessageToDeadLetterQueue)", m.CONSUMER_GROUP)
        for group, count in sorted(view.dead_lettered.items()):
            dlq(count, group)
        f.gauge("rocketraft_metrics_consumption_truncated", f"1 if more than {CONSUMPTION_QUEUES_MAX} queues had "
                "consumer state: the consumer metrics then leave some out")(int(view.consumption_truncated))
        self._consumption(f, view)

    def _consumption(self, f: m.Families, view: StateView) -> None:
        queue_lag = f.gauge("rocketraft_queue_lag_messages", "messages of one queue the group has not consumed "
                            "(max offset - consumer offset)", m.TOPIC, m.CONSUMER_GROUP, "queue_id")
        totals: dict[tuple[str, str], list[int]] = {}  # lag, ready, inflight, oldest unconsumed store ms, pop queues
        for q in view.consumption:
            p = q.progress
            queue_lag(p.lag, p.topic, q.group, p.queue_id)
            total = totals.setdefault((p.topic, q.group), [0, 0, 0, 0, 0])
            total[0] += p.lag
            if q.popped_offset is not None:
                total[1] += max(0, p.broker_offset - q.popped_offset)
                total[2] += p.inflight
                total[4] += 1
            if p.lag and q.oldest_unconsumed_store_ms:
                total[3] = min(total[3] or q.oldest_unconsumed_store_ms, q.oldest_unconsumed_store_ms)
        lag = f.gauge("rocketmq_consumer_lag_messages", "messages of the topic the group has not consumed",
                      m.TOPIC, m.CONSUMER_GROUP)
        ready = f.gauge("rocketmq_consumer_ready_messages", "pop consumption: messages never delivered to the group "
                        "yet (max offset - pop cursor)", m.TOPIC, m.CONSUMER_GROUP)
        inflight = f.gauge("rocketmq_consumer_inflight_messages", "pop consumption: messages delivered to the group "
                           "and not acknowledged yet", m.TOPIC, m.CONSUMER_GROUP)
        latency = f.gauge("rocketmq_consumer_lag_latency", "milliseconds since the oldest message the group has not "
                          "consumed became ready (0 when there is none)", m.TOPIC, m.CONSUMER_GROUP)
        now_ms = self.broker.replica.clock().group_time_ms or time.time_ns() // 1_000_000
        for (topic, group), (lag_total, ready_total, inflight_total, oldest_ms, pop_queues) in sorted(totals.items()):
            lag(lag_total, topic, group)
            if pop_queues:
                ready(ready_total, topic, group)
                inflight(inflight_total, topic, group)
            if oldest_ms or not lag_total:
                latency(max(0, now_ms - oldest_ms) if oldest_ms else 0, topic, group)


def serve(config: BrokerConfig, broker: Broker, queries: Queries, clients: ClientRegistry,
          traffic: Traffic, retention: Retention, renewals: Renewals) -> m.MetricsServer:
    host, port = config.metrics_address
    return m.serve(BrokerCollector(config, broker, queries, clients, traffic, retention, renewals), host, port,
                   "metricsPort", off="0")
