"""RocketMQ's Remoting protocol: its request and response codes, flags and language codes, and the one mapping from
rocketraft's errors (a v2 Code) to a Remoting response code. Values are RocketMQ's (RequestCode, ResponseCode,
LanguageCode in apache/rocketmq's remoting module); a 4.x client acts on them."""

from __future__ import annotations

import enum

from rocketraft.protocol.errors import REGISTRY, BadRequestError, Retry, RocketraftError
from rocketraft.protocol.wire import Code


class Request(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_BROKER_RUNTIME_INFO = 28          # mqadmin clusterList
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39          # broker -> client
    NOTIFY_CONSUMER_IDS_CHANGED = 40      # broker -> client
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46              # a 4.x consumer asks whether its SQL92 subscription is accepted
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_TOPIC_STATS_INFO = 202            # mqadmin topicStatus
    GET_CONSUME_STATS = 208               # mqadmin consumerProgress
    GET_TOPIC_CONFIG = 351                # mqadmin 5.x, before topicStatus and consumerProgress
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


class Response(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    CONSUMER_NOT_ONLINE = 206


FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
SERIALIZE_JSON, SERIALIZE_ROCKETMQ = 0, 1

LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS")
LANGUAGE_OTHER = LANGUAGES.index("OTHER")
# What this server calls itself in its own frames: the Go 4.x client reads only JAVA and GO and marks anything else
# unknown; RocketMQ's brokers say JAVA too
SERVER_LANGUAGE = LANGUAGES.index("JAVA")
SERVER_VERSION = 453  # RocketMQ 5.3's MQVersion: clients may switch features on the server's version


def language_code(name: str) -> int:
    return LANGUAGES.index(name) if name in LANGUAGES else LANGUAGE_OTHER


def language_name(code: int) -> str:
    return LANGUAGES[code] if 0 <= code < len(LANGUAGES) else "OTHER"


# A 4.x Java producer retries a send on another queue only after these answers (DefaultMQProducer's
# retryResponseCodes: TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR, NO_PERMISSION, ...); after anything
# else (SYSTEM_BUSY among them) it gives up at once. So every cause a retry can cure (busy, not the master, no master
# yet, a store that stops: the error registry's ELSEWHERE codes) is answered SERVICE_NOT_AVAILABLE, its remark
# naming the cause (docs/client.md); and REQUEST_TIMEOUT too, which the broker answers only for a send that never
# reached Raft (nothing stored). An unknown outcome (PROXY_TIMEOUT) is SYSTEM_ERROR, which the 4.x producer retries.
_RETRYABLE = frozenset({e.code for e in REGISTRY if e.retry is Retry.ELSEWHERE} | {Code.REQUEST_TIMEOUT})
_BY_CODE = {
    Code.OK: Response.SUCCESS,
    Code.TOPIC_NOT_FOUND: Response.TOPIC_NOT_EXIST,
    Code.CONSUMER_GROUP_NOT_FOUND: Response.SUBSCRIPTION_GROUP_NOT_EXIST,
    Code.MESSAGE_NOT_FOUND: Response.QUERY_NOT_FOUND,
    Code.ILLEGAL_FILTER_EXPRESSION: Response.SUBSCRIPTION_PARSE_FAILED,
    Code.UNAUTHORIZED: Response.NO_PERMISSION,
    Code.FORBIDDEN: Response.NO_PERMISSION,
    Code.UNSUPPORTED: Response.REQUEST_CODE_NOT_SUPPORTED,
    Code.NOT_IMPLEMENTED: Response.REQUEST_CODE_NOT_SUPPORTED,
    Code.PROXY_TIMEOUT: Response.SYSTEM_ERROR,  # outcome unknown: a retry is safe (sends are deduplicated by id)
}
_BAD_REQUEST_FAMILY = range(40000, 40100)  # BAD_REQUEST and every ILLEGAL_* / *_TOO_LARGE of the 400xx family
_TOO_LARGE = (Code.PAYLOAD_TOO_LARGE, Code.MESSAGE_BODY_TOO_LARGE, Code.MESSAGE_PROPERTIES_TOO_LARGE)


def response_of(code: int, *, send: bool = False) -> Response:
    """The Remoting response code of a v2 status code. `send`: the request stores a message, whose bad fields are
    MESSAGE_ILLEGAL as RocketMQ answers them (elsewhere INVALID_PARAMETER)."""
    if code in _RETRYABLE:
        return Response.SERVICE_NOT_AVAILABLE
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code in _BAD_REQUEST_FAMILY or code in _TOO_LARGE or code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE:
        return Response.MESSAGE_ILLEGAL if send else Response.INVALID_PARAMETER
    return Response.SYSTEM_ERROR


class RemotingError(BadRequestError):
    """A refusal that exists only in the Remoting protocol (a request code not served, a missing header field): it
    carries its Remoting response code itself."""

    def __init__(self, message: str, response: Response):
        super().__init__(message)
        self.response = response


def error_response(exc: BaseException, *, send: bool = False) -> tuple[Response, str]:
    """(response code, remark) of an error; the remark is the error's own message."""
    if isinstance(exc, RemotingError):
        return exc.response, exc.message
    if isinstance(exc, RocketraftError):
        return response_of(exc.code, send=send), exc.message
    return Response.SYSTEM_ERROR, f"internal error: {type(exc).__name__}: {exc}"

