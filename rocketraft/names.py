"""RocketMQ's naming rules, in one place for the broker, the NameServer and the clients."""

from __future__ import annotations

import re

from rocketraft.errors import BadRequestError
from rocketraft.wire import Code

NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # fullmatch: "^...$" with match would accept a trailing newline
TOPIC_NAME_CHARS_MAX = 127
GROUP_NAME_CHARS_MAX = 255
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
        raise BadRequestError(f"illegal consumer group {name!r}: use 1..{GROUP_NAME_CHARS_MAX} of [%|a-zA-Z0-9_-]",
                              Code.ILLEGAL_CONSUMER_GROUP)
    return name
