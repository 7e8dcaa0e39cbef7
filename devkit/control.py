"""Control channel of a stand-alone dledger replica process (demo, tests, benchmarks).

Authenticated request/response over multiprocessing.connection (HMAC challenge with a shared key),
bound to the replica's own loopback address. There is no default key: the starting process makes a random one
per cluster (`new_key`) and hands it to its replica processes in DLEDGER_CONTROL_KEY; a replica started without
one refuses to start, so nobody can drive a replica (or send it pickles) with a key known in advance.
Requests may be pipelined: each carries an id and
replies come back as their appends commit. The broker does not use this: it embeds the Replica.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict
from multiprocessing.connection import Client, Connection, Listener

from dledger import CommitUnknownError, DledgerError, Replica

log = logging.getLogger(__name__)

KEY_ENV = "DLEDGER_CONTROL_KEY"
KEY_CHARS_MIN = 32


def new_key() -> str:
    """A random control key for one cluster (64 hex digits)."""
    return secrets.token_hex(32)


def control_key(environ: dict | None = None) -> bytes:
    """The control key from DLEDGER_CONTROL_KEY; ValueError naming the variable if it is missing or short."""
    key = (os.environ if environ is None else environ).get(KEY_ENV, "")
    if len(key) < KEY_CHARS_MIN:
        raise ValueError(f"{KEY_ENV} is {'not set' if not key else f'{len(key)} characters'}: the control channel "
                         f"needs a key of at least {KEY_CHARS_MIN} characters (devkit.control.new_key() makes one)")
    return key.encode()


def error_reply(exc: BaseException) -> dict:
    if isinstance(exc, DledgerError):
        return {"error": exc.code, "message": exc.message, "leader_id": getattr(exc, "leader_id", None),
                "leader_address": getattr(exc, "leader_address", None)}
    return {"error": type(exc).__name__, "message": str(exc)}


class ControlServer:
    def __init__(self, replica: Replica, address: tuple[str, int], key: bytes):
        self.replica = replica
        self._listener = Listener(address, authkey=key)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="dledger-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_stopped(self) -> None:
        self._stopped.wait()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                continue
            except Exception:  # noqa: BLE001 - a failed handshake must not stop the server
                log.exception("control connection refused")
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        send_lock = threading.Lock()

        def reply(request_id, body):
            with send_lock:
                try:
                    conn.send((request_id, body))
                except OSError:
                    pass

        while True:
            try:
                request_id, op, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                self._dispatch(op, args, lambda body, rid=request_id: reply(rid, body))
            except Exception as exc:  # noqa: BLE001 - bad requests get an error reply
                reply(request_id, error_reply(exc))

    def _dispatch(self, op: str, args: dict, reply) -> None:
        r = self.replica
        if op == "append":
            future = r.append(args["payloads"])
            future.add_done_callback(lambda f: reply(_append_reply(f)))
        elif op == "status":
            st = asdict(r.status())
            st["role"] = st["role"].value
            reply(st)
        elif op == "stats":
            reply(r.stats)
        elif op == "read":
            entries = r.read(args["from_index"], args.get("max_entries", 1000))
            reply({"entries": [(e.index, e.term, e.payloads) for e in entries]})
        elif op == "digest":
            reply(log_digest(r, args.get("upto"), args.get("from_index", 1)))
        elif op == "counts":
            reply(r.state_machine.counts())
        elif op == "set_retention_floor":
            r.set_retention_floor(args["index"])
            reply({"ok": True})
        elif op == "bench_append":
            threading.Thread(target=lambda: reply(bench_append(r, **args)), daemon=True).start()
        elif op == "transfer_leadership":
            threading.Thread(target=lambda: reply(_transfer_reply(r, args)), daemon=True).start()
        elif op == "prepare_to_stop":
            threading.Thread(target=lambda: reply({"leads": r.prepare_to_stop()}), daemon=True).start()
        elif op == "shutdown":
            reply({"ok": True})
            self._stopped.set()
        else:
            reply({"error": "UNKNOWN_OP", "message": f"unknown control op {op!r}"})


def _transfer_reply(replica: Replica, args: dict) -> dict:
    try:
        return {"leader_id": replica.transfer_leadership(args.get("to"), args.get("timeout_s"))}
    except Exception as exc:  # noqa: BLE001 - the caller reads the error's code
        return error_reply(exc)


def _append_reply(future: Future) -> dict:
    exc = future.exception()
    if exc is not None:
        return error_reply(exc)
    result = future.result()
    return {"index": result.index, "term": result.term}


def log_digest(replica: Replica, upto: int | None = None, from_index: int = 1) -> dict:
    """SHA-256 over (index, term, payloads) of the committed data entries in [from_index, upto]
    (default upto: the applied index)."""
    upto = upto or replica.status().applied_index
    h = hashlib.sha256()
    count, next_index, last = 0, from_index, 0
    while True:
        batch = replica.read(next_index, max_entries=2000)
        batch = [e for e in batch if e.index <= upto]
        if not batch:
            break
        for e in batch:
            h.update(f"{e.index}:{e.term}:{len(e.payloads)}".encode())
            for p in e.payloads:
                h.update(len(p).to_bytes(4, "big"))
                h.update(p)
            count += 1
            last = e.index
        next_index = batch[-1].index + 1
    return {"upto": upto, "entries": count, "last_index": last, "sha256": h.hexdigest()}


def bench_append(replica: Replica, count: int, msgs_per_entry: int, msg_bytes: int, inflight: int) -> dict:
    """Append `count` entries of msgs_per_entry x msg_bytes with `inflight` outstanding; measured here,
    inside the leader process, so the figure is dledger's own and not the control channel's."""
    payloads = [os.urandom(msg_bytes) for _ in range(msgs_per_entry)]
    window = threading.Semaphore(inflight)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    done = threading.Event()
    remaining = itertools.count(count - 1, -1)
    lock = threading.Lock()

    def finished(f: Future, started: float) -> None:
        window.release()
        exc = f.exception()
        with lock:
            if exc is None:
                latencies.append(time.perf_counter() - started)
            else:
                key = exc.code if isinstance(exc, DledgerError) else type(exc).__name__
                errors[key] = errors.get(key, 0) + 1
            if next(remaining) == 0:
                done.set()

    t0 = time.perf_counter()
    for _ in range(count):
        window.acquire()
        started = time.perf_counter()
        replica.append(payloads).add_done_callback(lambda f, s=started: finished(f, s))
    if not done.wait(120):
        raise CommitUnknownError("benchmark did not finish within 120 s")
    elapsed = time.perf_counter() - t0
    latencies.sort()
    ok = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(ok - 1, int(p * ok))] * 1000 if ok else float("nan")

    return {"entries": ok, "messages": ok * msgs_per_entry, "seconds": elapsed,
            "messages_per_s": ok * msgs_per_entry / elapsed, "entries_per_s": ok / elapsed,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "errors": errors}


class ControlClient:
    """Client of one replica's control channel. Thread-safe; `call` blocks, `call_async` pipelines."""

    def __init__(self, address: tuple[str, int], key: bytes, timeout_s: float = 10.0):
        self.address = address
        self._conn = Client(address, authkey=key)
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._closed = False
        self._timeout_s = timeout_s
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while True:
            try:
                request_id, body = self._conn.recv()
            except (EOFError, OSError):
                break
            future = self._waiting.pop(request_id, None)
            if future is not None:
                future.set_result(body)
        for future in list(self._waiting.values()):
            if not future.done():
                future.set_exception(ConnectionError(f"control connection to {self.address} closed"))
        self._waiting.clear()

    def call_async(self, op: str, **args) -> Future:
        future: Future = Future()
        request_id = next(self._ids)
        self._waiting[request_id] = future
        with self._send_lock:
            self._conn.send((request_id, op, args))
        return future

    def call(self, op: str, timeout_s: float | None = None, **args):
        return self.call_async(op, **args).result(timeout_s or self._timeout_s)

    def close(self) -> None:
        self._conn.close()
