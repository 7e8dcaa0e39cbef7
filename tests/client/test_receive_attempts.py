"""Which attempt id our consumers send with each receive (rocketraft.client.consumer.ReceiveAttempts): the id of a
receive whose answer may have been lost is the id of the next receive of the same (topic, broker group)."""

from __future__ import annotations

from rocketraft.client.consumer import ReceiveAttempts
from rocketraft.protocol.rules import check_attempt_id

PAIR = ("orders", "broker-a")


def test_a_receive_that_got_messages_uses_its_id_up():
    attempts = ReceiveAttempts()
    first = attempts.take(PAIR)
    assert attempts.take(PAIR) != first  # not kept: the next receive is a new attempt
    assert check_attempt_id(first) == first  # what the broker's door accepts


def test_a_receive_that_failed_or_got_nothing_leaves_its_id_for_the_next_receive_of_the_pair():
    attempts = ReceiveAttempts()
    lost = attempts.take(PAIR)
    attempts.keep(PAIR, lost)
    assert attempts.take(("orders", "broker-b")) != lost  # another broker group: its own attempts
    assert attempts.take(PAIR) == lost
    assert attempts.take(PAIR) != lost  # used once more, then gone


def test_two_receives_in_flight_at_once_never_share_an_id():
    attempts = ReceiveAttempts()
    lost = attempts.take(PAIR)
    attempts.keep(PAIR, lost)
    one, two = attempts.take(PAIR), attempts.take(PAIR)
    assert one == lost and two != one
    attempts.keep(PAIR, two)
    attempts.keep(PAIR, one)  # both failed: one of them is tried again, the other is dropped
    assert attempts.take(PAIR) == two
