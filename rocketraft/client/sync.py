"""The blocking API: the same classes and method names as the asyncio API (rocketraft.aio), run on one
background event loop thread per process.

Every public coroutine method of a blocking class's asyncio class is a blocking method of the same name, made
when the blocking class is defined (Blocking.__init_subclass__): a method added to an asyncio class is blocking
in the blocking API at once, with nothing to keep in step by hand. A blocking class defines a method itself only
where it must differ (`send_async`) or where the asyncio method is plain but must run on the loop (`assign`).

`send_async` returns a concurrent.futures.Future here (an asyncio.Future in the asyncio API); callbacks run
on the client's loop thread and must not block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
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
    """Base of every blocking client: owns one asyncio client built on the client loop. A subclass names its asyncio
    class in `_async_class`; each public coroutine method of it that the subclass does not define becomes a
    blocking method (`blocking`)."""

    _async_class: type

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name in coroutine_methods(cls._async_class):
            if not hasattr(cls, name):
                setattr(cls, name, blocking(name, getattr(cls._async_class, name)))

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


def coroutine_methods(cls: type) -> list[str]:
    """The public coroutine methods of class `cls`, inherited ones included."""
    return sorted(name for name in dir(cls)
                  if not name.startswith("_") and inspect.iscoroutinefunction(getattr(cls, name)))


def blocking(name: str, async_method: Callable) -> Callable:
    """A blocking method that runs the asyncio client's coroutine method `name`, documented as `async_method`."""

    def method(self, *args, **kwargs):
        return run(getattr(self._impl, name)(*args, **kwargs))

    method.__name__ = name
    method.__doc__ = async_method.__doc__
    method.__signature__ = inspect.signature(async_method)
    return method
