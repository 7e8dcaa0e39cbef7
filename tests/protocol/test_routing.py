"""Routing rules (rocketraft.protocol.routing): RocketMQ's AllocateMessageQueueAveragely for pull consumers."""

from __future__ import annotations

from rocketraft.protocol.routing import allocate_averagely


def test_eight_queues_over_three_members_give_contiguous_slices_of_three_three_and_two():
    queues = list(range(8))
    shares = [allocate_averagely(queues, ["c", "a", "b"], me) for me in ("a", "b", "c")]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_more_members_than_queues_leaves_the_last_members_without_a_queue():
    assert [allocate_averagely([0, 1], ["a", "b", "c"], me) for me in ("a", "b", "c")] == [[0], [1], []]


def test_a_client_that_is_not_a_member_owns_nothing():
    assert allocate_averagely([0, 1, 2], ["a", "b"], "z") == []
