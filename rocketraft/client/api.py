"""The blocking classes (exported as `rocketraft.Producer`, ...): the asyncio classes' methods, run on the
process's client loop thread (rocketraft/client/sync.py). Same names and arguments as `rocketraft.aio`."""

from __future__ import annotations

from . import admin as _admin
from . import producer as _producer
from . import pull_consumer as _pull
from . import push_consumer as _push
from . import simple_consumer as _simple
from . import transaction as _transaction
from .sync import Blocking, blocking, run, submit


class Producer(Blocking):
    """Blocking producer; see rocketraft.aio.Producer for every argument."""
    _async_class = _producer.Producer
    send = blocking("send", "Send and wait for the acknowledgement; returns a SendReceipt.")
    send_batch = blocking("send_batch", "Send many messages with the least work per message; one receipt each.")
    flush = blocking("flush", "Wait for every send_async / send_oneway started so far.")
    recall = blocking("recall", "Recall a sent message no consumer group got yet; returns a RecallResult.")

    def stats(self) -> dict:
        """Per broker address written to: SendMessage requests and messages sent."""
        return run(_on_loop(self._impl.stats))

    def send_async(self, message, callback=None, selector=None):
        """Start a send; returns a concurrent.futures.Future of the SendReceipt. callback(receipt, error) runs on
        the client's loop thread. Like every send_async, flush() and close() wait for it."""
        future = submit(_tracked_send(self._impl, message, selector))
        if callback is not None:
            future.add_done_callback(lambda f: callback(None if f.exception() else f.result(), f.exception()))
        return future

    def send_oneway(self, message) -> None:
        """Send without waiting or reporting (failures are only logged)."""
        submit(_oneway(self._impl, message))


async def _tracked_send(producer, message, selector):
    return await producer.send_async(message, selector=selector)


async def _oneway(producer, message) -> None:
    producer.send_oneway(message)


class TransactionProducer(Producer):
    _async_class = _transaction.TransactionProducer
    send_half = blocking("send_half")
    commit = blocking("commit")
    rollback = blocking("rollback")
    send_in_transaction = blocking("send_in_transaction")


class Admin(Blocking):
    _async_class = _admin.Admin
    cluster_list = blocking("cluster_list")
    topic_list = blocking("topic_list")
    topic_route = blocking("topic_route")
    create_topic = blocking("create_topic")
    update_topic = blocking("update_topic")
    delete_topic = blocking("delete_topic")
    create_group = blocking("create_group")
    query_message_by_key = blocking("query_message_by_key")
    query_message_by_id = blocking("query_message_by_id")
    consumer_progress = blocking("consumer_progress")
    transfer_leader = blocking("transfer_leader")


class SimpleConsumer(Blocking):
    """Blocking SimpleConsumer; see rocketraft.aio.SimpleConsumer."""
    _async_class = _simple.SimpleConsumer
    receive = blocking("receive")
    ack = blocking("ack")
    change_invisible_duration = blocking("change_invisible_duration")
    dead_letter = blocking("dead_letter")


class PullConsumer(Blocking):
    """Blocking PullConsumer; see rocketraft.aio.PullConsumer."""
    _async_class = _pull.PullConsumer
    poll = blocking("poll")
    commit = blocking("commit")
    seek = blocking("seek")
    committed = blocking("committed")

    def assign(self, queues) -> None:
        run(_on_loop(self._impl.assign, queues))

    def assignment(self):
        return run(_on_loop(self._impl.assignment))


class PushConsumer(Blocking):
    """Blocking PushConsumer: start() and close(); a plain-function listener runs on its consume threads."""
    _async_class = _push.PushConsumer


async def _on_loop(fn, *args):
    return fn(*args)


__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer", "SimpleConsumer", "TransactionProducer", "run"]
