"""The blocking classes (exported as `rocketraft.Producer`, ...): the asyncio classes' methods, run on the
process's client loop thread (rocketraft/client/sync.py). Same names and arguments as `rocketraft.aio`.

Every public coroutine method of the asyncio class is a blocking method here without being listed (sync.Blocking
makes them); a class below defines only the methods that must differ from "run the coroutine and wait"."""

from __future__ import annotations

from . import admin as _admin
from . import producer as _producer
from . import pull_consumer as _pull
from . import push_consumer as _push
from . import simple_consumer as _simple
from . import transaction as _transaction
from .sync import Blocking, run, submit


class Producer(Blocking):
    """Blocking producer; see rocketraft.aio.Producer for every argument."""
    _async_class = _producer.Producer

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
    """Blocking TransactionProducer; see rocketraft.aio.TransactionProducer."""
    _async_class = _transaction.TransactionProducer


class Admin(Blocking):
    """Blocking admin client; see rocketraft.aio.Admin for every method."""
    _async_class = _admin.Admin


class SimpleConsumer(Blocking):
    """Blocking SimpleConsumer; see rocketraft.aio.SimpleConsumer."""
    _async_class = _simple.SimpleConsumer


class PullConsumer(Blocking):
    """Blocking PullConsumer; see rocketraft.aio.PullConsumer."""
    _async_class = _pull.PullConsumer

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
