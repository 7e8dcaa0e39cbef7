"""PushConsumer arguments checked when it is built (no cluster needed): consume_from per consumption model."""

from __future__ import annotations

import pytest

from rocketraft.client.push_consumer import PushConsumer
from rocketraft.protocol.errors import BadRequestError


def build(**kwargs) -> PushConsumer:
    consumer = PushConsumer("127.0.0.1:9876", group="g-args", subscriptions={"orders": "*"},
                            listener=lambda message: None, **kwargs)
    consumer._pool.shutdown(wait=False)  # never started: nothing else to release
    return consumer


@pytest.mark.parametrize("given", [None, "first"])
def test_a_clustering_push_consumer_accepts_consume_from_first_which_is_what_a_new_group_does(given):
    assert build(consume_from=given).consume_from == "first"


def test_a_clustering_push_consumer_refuses_consume_from_last_instead_of_ignoring_it():
    with pytest.raises(BadRequestError, match=r"consume_from='last' cannot apply to a clustering push consumer.*"
                                              r"broadcasting=True"):
        build(consume_from="last")


def test_an_unknown_consume_from_is_refused_by_name_in_either_model():
    for broadcasting in (False, True):
        with pytest.raises(BadRequestError, match=r"consume_from must be 'first' or 'last', not 'middle'"):
            build(consume_from="middle", broadcasting=broadcasting)


@pytest.mark.parametrize(("given", "starts"), [(None, "last"), ("first", "first"), ("last", "last")])
def test_a_broadcasting_push_consumer_starts_new_queues_at_consume_from_last_by_default(given, starts):
    assert build(consume_from=given, broadcasting=True).consume_from == starts
