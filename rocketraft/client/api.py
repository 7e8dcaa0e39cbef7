"""The blocking classes (exported as `rocketraft.Producer`, ...): the asyncio classes' methods, run on the
process's client loop thread (rocketraft/client/sync.py). Same names and arguments as `rocketraft.aio`."""

from __future__ import annotations

from . import admin as _admin
from . import producer as _producer
from . import transaction as _transaction
from .sync import Blocking, blocking, in_background, run, submit


class Producer(Blocking):
    """Blocking producer; see rocketraft.aio.Producer for every argument."""
    _async_class = _producer.Producer
    send = blocking("send", "Send and wait for the acknowledgement; returns a SendReceipt.")
    send_async = in_background("send", "Start a send; returns a concurrent.futures.Future of the SendReceipt. "
                                       "callback(receipt, error) runs on the client's loop thread.")
    flush = blocking("flush", "Wait for every send_async / send_oneway started so far.")

    def send_oneway(self, message) -> None:
        """Send without waiting or reporting (failures are only logged)."""
        submit(_oneway(self._impl, message))


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


__all__ = ["Producer", "TransactionProducer", "Admin", "run"]
