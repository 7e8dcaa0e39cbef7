"""Every protocol limit and reserved name, in one place for the broker, the NameServer and the clients.

Broker settings that an operator may change (maxMessageSize, receiveBatchSizeMax, ...) take their defaults
from here. rocketraft's client learns one of them from the brokers (the body size, Telemetry's
publishing.max_body_size) and checks the others against these defaults; where a broker's setting is stricter, its
own refusal names it (docs/client.md, "Limits"). The brokers also send subscription.receive_batch_size and
long_polling_timeout to push consumers of the official SDKs, which use them.
"""

from __future__ import annotations

# -- names ----------------------------------------------------------------------------------------------
TOPIC_NAME_CHARS_MAX = 127
GROUP_NAME_CHARS_MAX = 255
RETRY_TOPIC_PREFIX = "%RETRY%"        # %RETRY%<group>: messages a consumer group will get again
DLQ_TOPIC_PREFIX = "%DLQ%"            # %DLQ%<group>: messages past maxReconsumeTimes
NAMESPACE_CHARS_MAX = 64              # of [a-zA-Z0-9_-]; a namespaced name is stored as <namespace>%<name>, and
                                      # that stored name must still fit TOPIC_NAME_CHARS_MAX / GROUP_NAME_CHARS_MAX

# -- message fields -------------------------------------------------------------------------------------
BODY_BYTES_MAX = 4 * 1024 * 1024      # maxMessageSize default (RocketMQ's 4 MiB)
TAG_CHARS_MAX = 128
KEY_CHARS_MAX = 128
KEYS_MAX = 32
MESSAGE_GROUP_CHARS_MAX = 64
MESSAGE_ID_CHARS_MAX = 128
# LMDB refuses keys longer than 511 bytes (MDB_BAD_VALSIZE). Ids, keys and names end up inside index keys
# together with a small prefix, so their UTF-8 form must stay well under that: 128 emoji are 512 bytes.
INDEXED_FIELD_BYTES_MAX = 256
PROPERTY_KEY_CHARS_MAX = 64
PROPERTIES_BYTES_MAX = 16 * 1024      # messagePropertiesBytesMax default: keys + values of user properties
# deliveryFrameBytesMax default: a message is refused at send if, as a consumer receives it (body, properties and the
# broker's delivery fields), it would not fit in a gRPC message of this size: grpc's default receive limit, which the
# official Node.js and Python SDKs keep, and the Go SDK before 5.1.3 (they could never receive it: docs/client.md,
# "The official RocketMQ 5 SDKs")
DELIVERY_FRAME_BYTES_MAX = 4 * 1024 * 1024
# what the broker adds to a stored message when it delivers it, at most: receipt handle, queue id and offset, store
# time, delivery attempt, invisible duration, a dead letter's origin, __SHARDINGKEY and __transactionId__, the
# response's framing (measured: under 600 bytes; tests/sdk_go checks the largest accepted message is received)
DELIVERY_OVERHEAD_BYTES_MAX = 2048
RESERVED_PROPERTY_PREFIX = "__"       # user property keys may not start with it
DELAY_LEVEL_PROPERTY = "DELAY"        # RocketMQ's delayTimeLevel: 1..len(DELAY_LEVELS)
QUEUE_ID_PROPERTY = "QUEUE_ID"        # the queue the producer chose (decimal); routing only, not stored
# RocketMQ 5's relative timers (a 5.x client's setDelayTimeSec/setDelayTimeMs): the delivery time is the broker
# group's time at the send plus this delay, decimal seconds or milliseconds; read at the send, not stored
TIMER_DELAY_SEC_PROPERTY = "TIMER_DELAY_SEC"
TIMER_DELAY_MS_PROPERTY = "TIMER_DELAY_MS"
RESERVED_PROPERTIES = frozenset({DELAY_LEVEL_PROPERTY, QUEUE_ID_PROPERTY, TIMER_DELAY_SEC_PROPERTY,
                                 TIMER_DELAY_MS_PROPERTY})
# A recall handle (SendResultEntry.recall_handle, every message): "<broker group>:<token>:<message id>", the token
# RECALL_TOKEN_BYTES random bytes in hex chosen by the master when it stored the message (docs/client.md, "Recall").
RECALL_TOKEN_BYTES = 12
RECALL_HANDLE_CHARS_MAX = 512

# RocketMQ's 18 delay levels (messageDelayLevel default).
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DELAY_LEVEL_COUNT = len(DELAY_LEVELS.split())
DELIVERY_DELAY_MS_MAX = 40 * 86_400_000  # timerMaxDelayMillis default: 40 days (RocketMQ 5's timer)

# -- requests -------------------------------------------------------------------------------------------
SEND_MESSAGES_PER_REQUEST_MAX = 1024  # messages in one SendMessage (rocketraft's producer batches up to this)
ACK_ENTRIES_PER_REQUEST_MAX = 1024    # entries in one AckMessage (each one is a command through Raft)

# -- queues ---------------------------------------------------------------------------------------------
QUEUES_PER_TOPIC_DEFAULT = 8          # per broker group
QUEUE_NUMS_MAX = 1024                 # topicQueueNumsMax's default and ceiling (the NameServers' limit)

# -- consumption ----------------------------------------------------------------------------------------
RECEIVE_BATCH_SIZE_MAX = 64           # receiveBatchSizeMax default
# rocketraft's batched read (FastConsume.PullBatch): at most this many messages in one answer, and no message added
# once the answer holds this many bytes (one message always fits: a body is at most 4 MiB, a gRPC message 16 MiB).
PULL_BATCH_MESSAGES_MAX = 1024
PULL_BATCH_BYTES_MAX = 8 * 1024 * 1024
LONG_POLLING_MS_MAX = 30_000          # longPollingTimeoutMillisMax default
INVISIBLE_MS_MIN = 1_000              # invisibleTimeMillisMin default
INVISIBLE_MS_MAX = 12 * 3_600_000     # invisibleTimeMillisMax default
MAX_RECONSUME_TIMES = 16              # then %DLQ%<group>
# ReceiveMessageRequest.attempt_id (idempotent receive, docs/client-consumers.md): printable ASCII, this long at
# most (the SDKs send a UUID, 36 characters). A broker group remembers at most POP_ATTEMPTS_PER_GROUP_MAX attempts
# per consumer group (the oldest is forgotten first), each until the invisibility of its messages ends.
POP_ATTEMPT_ID_CHARS_MAX = 64
POP_ATTEMPTS_PER_GROUP_MAX = 1024
# What a push consumer asks per receive and how long it long-polls (sent to the official SDKs' push consumers
# in their settings; rocketraft's PushConsumer uses the same).
PUSH_RECEIVE_BATCH_SIZE = 32
PUSH_LONG_POLLING_MS = 20_000
# Redelivery backoff of a consumer group's retried messages (RocketMQ's retry levels 1s .. 2h), used by the
# broker for pop consumers and sent to push consumers in their settings.
RETRY_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
# The same range as an exponential backoff (1 s doubling up to 2 h), for the SDKs that read no other kind.
RETRY_BACKOFF_MULTIPLIER = 2.0
# A producer's send retries, sent in its settings when it named no policy of its own (RocketMQ 5 proxy's
# grpcClientProducer* defaults); the Node.js SDK refuses settings without an exponential backoff.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2

# -- transport ------------------------------------------------------------------------------------------
# A request is at most one body plus properties (the broker validates the body itself and says so; this is
# the hard cap of every gRPC server and channel).
GRPC_MESSAGE_BYTES_MAX = 16 * 1024 * 1024
# Every gRPC server (broker, NameServer): RPCs served at once (long polls and Telemetry streams count; one more
# is refused with RESOURCE_EXHAUSTED), and how long a connection with no RPC stays open before the server
# closes it (a client reconnects on its next call; 4,000 idle connections once held 4,000 descriptors for ever).
RPCS_IN_FLIGHT_MAX = 10_000
CONNECTION_IDLE_MS = 120_000
# Connections a server holds at once (grpc closes one more before its handshake: the client sees UNAVAILABLE
# "Socket closed"), and how long a new connection may take to become HTTP/2 (TLS included) before the server drops
# it: a socket that never speaks holds a slot for this long at most, not until connectionIdleMillis.
CONNECTIONS_MAX = 10_000
HANDSHAKE_TIMEOUT_MS = 10_000
# Replies and pushes a broker holds for one Telemetry stream that its client does not read: when they are this many,
# the broker stops reading the stream's frames (gRPC flow control then holds the client) and skips the stream for
# transaction check-backs. Unbounded, 50 streams whose clients sent settings frames and never read grew a master by
# 60 MB/s (issue 18).
TELEMETRY_PENDING_MAX = 64
# ... and their bytes (broker/outboxes.py): per caller (its ACL 2.0 user, else its address) and in total. A stream with
# nothing pending always takes one (a check-back carries a whole message). 50 streams of one caller that never read
# held 1.58 GB (issue 30, item 8).
TELEMETRY_PENDING_BYTES_PER_CALLER_MAX = 32 * 1024 * 1024
TELEMETRY_PENDING_BYTES_MAX = 256 * 1024 * 1024
# Topics one Telemetry settings frame may name (a producer's publishing topics, a consumer's subscriptions): the
# broker answers settings with the topics echoed, so 64 pending answers to settings naming ~300k topics each held
# about 1 GB per stream that never read (issue 30, item 8). A client declares a few; one more is refused by name.
SETTINGS_TOPICS_MAX = 1024

# -- RocketMQ's Remoting protocol (4.x clients: docs/client.md, "RocketMQ 4.x clients") --------------------------
# A frame (its length field excluded) is at most this long: RocketMQ's default (com.rocketmq.remoting.frameMaxLength)
REMOTING_FRAME_BYTES_MAX = 16 * 1024 * 1024
REMOTING_EXT_FIELDS_MAX = 64          # header fields of one request (a 4.x request sends at most about 20)
# Requests one connection has in flight at once: one more is answered SYSTEM_BUSY at once (a pull consumer's long polls
# count; the Java 4.x client keeps at most 65,535 async requests in flight, a push consumer one pull per queue)
REMOTING_REQUESTS_PER_CONNECTION_MAX = 1024
REMOTING_CONNECTIONS_MAX = 10_000     # connections a Remoting port holds at once; one more is closed at accept
REMOTING_HEARTBEAT_GROUPS_MAX = 64      # producer and consumer groups one 4.x heartbeat may name (a client has a few)
REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX = 256  # subscriptions of one consumer group in one heartbeat
REMOTING_IDLE_MS = 120_000            # a connection with nothing in flight and no frame for this long is closed
REMOTING_BROKER_PORT_DEFAULT = 10911  # RocketMQ's broker listenPort
REMOTING_NAMESRV_PORT_DEFAULT = 9877  # 9876 (RocketMQ's) is the NameServer's gRPC port here

# -- registration ---------------------------------------------------------------------------------------
# A replica's heartbeatTimeoutMillis: the NameServers refuse a registration asking for more (a replica silent longer
# than this is surely gone), and a broker refuses the setting at start.
HEARTBEAT_TIMEOUT_MS_MAX = 10 * 60 * 1000
