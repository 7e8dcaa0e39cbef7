"""Reading a Remoting request (broker/remoting.py): its header fields and JSON bodies, each refused by name when it
is missing, malformed or out of range, and the ranges RocketMQ 4.x clients' fields are held to."""

from __future__ import annotations

import json

from rocketraft.protocol.wire import pb
from rocketraft.remoting.codes import RemotingError, Response
from rocketraft.remoting.frame import Command

TIMESTAMP_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the end of a protobuf Timestamp
RECONSUME_TIMES_MAX = 1_000_000  # a message's delivery attempt (a protobuf int32) with room to spare
INT32_MAX = (1 << 31) - 1
TAG_TYPE, SQL_TYPE = "TAG", "SQL92"


def field(request: Command, name: str, ext: dict[str, str] | None = None) -> str:
    value = (request.ext if ext is None else ext).get(name)
    if not value:
        raise RemotingError(f"request {request.code} lacks header field {name}", Response.INVALID_PARAMETER)
    return value


def int_field(ext: dict[str, str], name: str, default: int | None = None, lo: int = -(1 << 63),
              hi: int = (1 << 63) - 1) -> int:
    value = ext.get(name)
    if value is None or value == "":
        if default is None:
            raise RemotingError(f"request lacks header field {name}", Response.INVALID_PARAMETER)
        return default
    try:
        number = int(value)
    except ValueError:
        raise RemotingError(f"header field {name} {value[:40]!r} is not an integer", Response.INVALID_PARAMETER) \
            from None
    if not lo <= number <= hi:
        raise RemotingError(f"header field {name} {value[:40]} is out of range {lo}..{hi}", Response.INVALID_PARAMETER)
    return number


def text(value, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise RemotingError(f"body field {name} is missing or not a string", Response.INVALID_PARAMETER)
    return value


def json_body(request: Command, what: str) -> dict:
    try:
        data = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemotingError(f"{what} body is not JSON: {exc}", Response.INVALID_PARAMETER) from None
    except RecursionError:
        raise RemotingError(f"{what} body is JSON nested too deeply", Response.INVALID_PARAMETER) from None
    if not isinstance(data, dict):
        raise RemotingError(f"{what} body is not a JSON object", Response.INVALID_PARAMETER)
    return data


def objects(data: dict, name: str) -> list[dict]:
    """A JSON body's list of objects (missing: empty); anything else is refused by name."""
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise RemotingError(f"body field {name} is not a list of objects", Response.INVALID_PARAMETER)
    return value


def as_json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def expression(kind, value) -> tuple[str, pb.FilterExpression]:
    """A subscription's (expression type, filter) from a heartbeat, a pull or a client-config check."""
    kind = kind or TAG_TYPE
    value = value if isinstance(value, str) and value else "*"
    if kind == SQL_TYPE:
        return kind, pb.FilterExpression(type=pb.FilterType.SQL, expression=value)
    if kind != TAG_TYPE:
        raise RemotingError(f"expression type {str(kind)[:40]!r} is not TAG or SQL92",
                            Response.SUBSCRIPTION_PARSE_FAILED)
    return kind, pb.FilterExpression(type=pb.FilterType.TAG, expression=value)
