"""RocketMQ's naming rules, in one place for the broker, the NameServer and the clients."""

from __future__ import annotations

import re

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import DLQ_TOPIC_PREFIX, GROUP_NAME_CHARS_MAX, RETRY_TOPIC_PREFIX, TOPIC_NAME_CHARS_MAX
from rocketraft.protocol.wire import Code

NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # fullmatch: "^...$" with match would accept a trailing newline
TOPIC_NAME_RULE = f"topic names match ^[%|a-zA-Z0-9_-]+$ and are at most {TOPIC_NAME_CHARS_MAX} characters"


def check_topic_name(name: str) -> str:
    """Raise BadRequestError(ILLEGAL_TOPIC) naming the rule unless `name` follows it."""
    if len(name) > TOPIC_NAME_CHARS_MAX:
        problem = f"{len(name)} characters is longer than {TOPIC_NAME_CHARS_MAX}"
    elif not NAME_PATTERN.fullmatch(name):
        problem = "it is empty" if not name else "it has characters outside ^[%|a-zA-Z0-9_-]+$"
    else:
        return name
    raise BadRequestError(f"illegal topic name {name[:TOPIC_NAME_CHARS_MAX + 1]!r}: {problem}; {TOPIC_NAME_RULE}",
                          Code.ILLEGAL_TOPIC)


def check_group_name(name: str) -> str:
    if not name or len(name) > GROUP_NAME_CHARS_MAX or not NAME_PATTERN.fullmatch(name):
        raise BadRequestError(f"illegal consumer group {name[:GROUP_NAME_CHARS_MAX + 1]!r}: use "
                              f"1..{GROUP_NAME_CHARS_MAX} of [%|a-zA-Z0-9_-]", Code.ILLEGAL_CONSUMER_GROUP)
    return name


def retry_topic(group: str) -> str:
    """The topic a consumer group's retried messages live in."""
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """The topic a consumer group's dead letters go to."""
    return DLQ_TOPIC_PREFIX + group
