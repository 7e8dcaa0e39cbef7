"""What applying a command answers (broker/statemachine.py): its results, its deliberate refusal (`ApplyError`) and
the error that stops a replica (`InvariantError`); and the fields of a stored send, which apply, retention and the
doors read alike. The lowest of apply's modules: every other one, and the jobs that read the results, import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import pb


@dataclass(frozen=True)
class ApplyError:
    """A deliberate refusal of one command by a named check: deterministic, so every replica refuses it."""
    code: int
    message: str


class InvariantError(RuntimeError):
    """The tables or the log broke an invariant apply relies on. Raised out of apply, so dledger stops the
    replica (`status().failure` names it) instead of applying on top of state that may differ from the others'."""


class SendResult(NamedTuple):
    """A NamedTuple, not a frozen dataclass: made once per message on every replica, it costs 0.17 us
    instead of 0.5 us."""
    queue: int
    offset: int  # t.NO_OFFSET while delayed or half
    deduplicated: bool
    recall_token: bytes = b""  # deduplicated: the stored copy's token (its recall handle is the first one's)
    index: int = 0  # where the message is stored (the stored copy's place when deduplicated): its log position
    slot: int = 0


@dataclass(frozen=True)
class Popped:
    topic: str
    queue: int
    offset: int
    index: int
    slot: int
    attempt: int
    handle: str
    deadline_ms: int


@dataclass(frozen=True)
class RecallResult:
    message_id: str
    delayed: bool                 # a delay message taken off its timer (no group could have had it)
    had_it: tuple[str, ...]       # consumer groups that had received (or pulled past) it before the recall
    again: bool                   # it was recalled already: nothing changed


@dataclass(frozen=True)
class HandleResult:
    handle: str  # the new receipt handle (CHANGE_INVISIBLE) or the one acknowledged


def send_fields(send: spb.SendCommand) -> tuple[str, str, str]:
    """(topic, message id, tag) of a stored send, from its copies or, in older logs, from its message."""
    if send.topic:
        return send.topic, send.message_id, send.tag
    props = (message := pb.Message.FromString(send.message)).system_properties
    return message.topic.name, props.message_id, props.tag
