"""Which invisible durations the door accepts: a receive's from invisibleTimeMillisMin, a ChangeInvisibleDuration's
from 0 ms, as RocketMQ's proxy does (the official SDKs' "consume later" asks for a retry delay there, and the
Node.js SDK 1.0.8 asks for 0 or a few milliseconds: tests/sdk_node covers the SDK itself)."""

from __future__ import annotations

import pytest

from broker import validation
from broker.config import BrokerConfig
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import Code

CONFIG = BrokerConfig()
MAX_MS = CONFIG.invisibleTimeMillisMax


@pytest.mark.parametrize("duration_ms", [0, 1, 999, CONFIG.invisibleTimeMillisMin, MAX_MS])
def test_a_change_of_invisibility_may_ask_any_duration_from_zero_to_the_max(duration_ms):
    assert validation.changed_invisible_ms(duration_ms, CONFIG) == duration_ms


@pytest.mark.parametrize("duration_ms", [-1, MAX_MS + 1])
def test_a_change_of_invisibility_below_zero_or_over_the_max_is_refused_by_name(duration_ms):
    with pytest.raises(RocketraftError, match=f"invisible duration {duration_ms} ms: use 0..{MAX_MS} ms") as refused:
        validation.changed_invisible_ms(duration_ms, CONFIG)
    assert refused.value.code == Code.ILLEGAL_INVISIBLE_TIME


@pytest.mark.parametrize("duration_ms", [0, CONFIG.invisibleTimeMillisMin - 1, MAX_MS + 1])
def test_a_receive_still_needs_the_minimum_invisible_duration(duration_ms):
    with pytest.raises(RocketraftError) as refused:
        validation.invisible_ms(duration_ms, CONFIG)
    assert refused.value.code == Code.ILLEGAL_INVISIBLE_TIME
