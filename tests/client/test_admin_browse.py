"""Admin.browse_messages reads up to its documented 256 newest messages of a queue, not only as many as one
PullMessage may carry (the brokers' receiveBatchSizeMax, 64 by default)."""

from __future__ import annotations

import rocketraft
from rocketraft.client.admin import BROWSE_MESSAGES_MAX
from rocketraft.protocol.limits import RECEIVE_BATCH_SIZE_MAX


def test_browse_messages_returns_the_newest_messages_even_beyond_one_pull(shared_cluster):
    topic = "browse-beyond-one-pull"
    shared_cluster.create_topic(topic, queue_nums=1)
    with rocketraft.Producer(shared_cluster.namesrv_address) as producer:
        sent = [producer.send(rocketraft.Message(topic, b"%d" % i)).message_id for i in range(300)]  # in queue order
    with rocketraft.Admin(shared_cluster.namesrv_address) as admin:
        for wanted in (RECEIVE_BATCH_SIZE_MAX, RECEIVE_BATCH_SIZE_MAX + 36, BROWSE_MESSAGES_MAX):
            browsed = [m.message_id for m in admin.browse_messages(topic, max_messages=wanted)]
            assert browsed == sent[-wanted:], f"browse_messages(max_messages={wanted}) got {len(browsed)} messages"
