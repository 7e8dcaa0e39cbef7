"""The blocking API: the same classes and method names as the asyncio API (rocketraft.aio), run on one
background event loop thread per process.

`send_async` returns a concurrent.futures.Future here (an asyncio.Future in the asyncio API); callbacks run
on the client's loop thread and must not block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def client_loop() -> asyncio.AbstractEventLoop:
    """The process's client loop (a daemon thread, started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rocketraft-client", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Coroutine, timeout_s: float | None = None) -> Any:
    loop = client_loop()
    if _running_on(loop):
        coro.close()
        raise RuntimeError("a blocking rocketraft call was made from a client callback (the client's own loop "
                           "thread); use the asyncio API (rocketraft.aio) there, or hand the work to a thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)


def submit(coro: Coroutine) -> concurrent.futures.Future:
    return asyncio.run_coroutine_threadsafe(coro, client_loop())


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _construct(cls, args, kwargs):
    return cls(*args, **kwargs)


class Blocking:
    """Base of every blocking client: owns one asyncio client built on the client loop."""

    _async_class: type

    def __init__(self, *args, **kwargs):
        self._impl = run(_construct(self._async_class, args, kwargs))

    def __getattr__(self, name: str):  # plain attributes (client_id, config, ...) of the asyncio client
        if name == "_impl":
            raise AttributeError(name)
        return getattr(self._impl, name)

    def start(self):
        run(self._impl.start())
        return self

    def close(self) -> None:
        run(self._impl.close())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def blocking(name: str, doc: str | None = None) -> Callable:
    """A blocking method that runs the asyncio client's coroutine method `name`."""

    def method(self, *args, **kwargs):
        return run(getattr(self._impl, name)(*args, **kwargs))

    method.__name__ = name
    method.__doc__ = doc
    return method

