"""One chaos run: start a cluster, run the clients and the nemesis schedule for the time limit, heal, drain,
check the history (and optionally audit the replicas' stores), write the results. Cleanup always runs.

Phases, all timed on the history's clock:
  1. setup      cluster (own 127.0.0.x per replica; a tmpfs per replica when disk faults are on), topic, group
  2. chaos      senders at --rate over --concurrency processes, consumers, and the nemesis: quiet for about
                --interval seconds, then a fault (one family, or two at once with --combine) for --fault
                seconds, healed, and again, until --time-limit
  3. drain      senders stop, every fault is healed, consumers go on until no send is in flight any more,
                every acknowledged message was consumed and nothing came for quiet_s (3 s), or --drain
                seconds pass
  4. check      the queue checker over the history; with --audit, the Spark audit over the stopped replicas
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from devkit.history import Recorder
from rocketraft.protocol.wire import MessageType

from . import checker, nemesis, report
from .cluster import ChaosCluster
from .workloads import CONSUMER_GROUP, RECEIVE_WAIT_S, TOPIC, Workload
from .workloads import make as make_workload
from .workloads import unavailable as workload_unavailable

log = logging.getLogger("jepsen_tests")

SEND_OP_TIMEOUT_S = 10.0  # the harness's own guard; a send ends (ok, fail or info) within send_timeout first
RECEIVE_OP_TIMEOUT_S = RECEIVE_WAIT_S + 8.0
EXIT_VALID, EXIT_INVALID, EXIT_USAGE, EXIT_HARNESS = 0, 1, 2, 3
INTERRUPTING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # like Ctrl-C: the cleanup runs, the exit code is 130
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUDIT_BAD_INPUT_EXIT = 2  # `python -m audit` exit codes (audit/__main__.py): 0 valid, 1 invalid, 2 bad input, 3 failed
FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
RETENTION_CHECK_MS = 500  # cleanResourceInterval with --retention-s: a wrong clock has many chances to delete
# --expose-retention: consumers wait this long after a heal (four retention runs), and catch up within the margin
HOLD_AFTER_HEAL_S = 2.0
CATCH_UP_MARGIN_S = 4.0
AUDIT_TIMEOUT_S = 3600.0  # the audit of a long run's stores takes minutes; beyond this it is reported as failed


@dataclass
class RunConfig:
    workload: str = "queue"
    nemesis: list[str] = field(default_factory=lambda: ["kill"])
    time_limit_s: float = 120.0
    rate: float = 200.0            # sends per second, over all sender processes
    concurrency: int = 8           # sender processes (each has at most one send in flight)
    consumers: int = 2             # consumer processes
    replicas: int = 3
    message_groups: int = 16
    interval_s: float = 10.0       # quiet time between faults (± 50 %)
    fault_s: float = 10.0          # how long a fault lasts
    combine: bool = False          # now and then, two faults of different families at once
    drain_s: float = 60.0
    quiet_s: float = 3.0
    seed: int = 0
    out_dir: str = "jepsen_tests/store"
    audit: bool = False
    audit_master: str = "local[2]"
    disk_mib: int = 0              # tmpfs per replica (0: 256 when the disk nemesis is on, else none)
    flush: str = "ASYNC_FLUSH"     # the group's flushDiskType: ASYNC_FLUSH or SYNC_FLUSH
    retention_s: float = 0.0       # > 0: the group's fileReservedTime in seconds (retention every RETENTION_CHECK_MS)
    # before each fault the senders pause until everything sent so far expired (retention_s + 2 s; the consumers
    # take it all first), and the consumers stop during the fault and for HOLD_AFTER_HEAL_S after it: whatever was
    # sent while the fault lasted heads every queue then, where retention looks first
    expose_retention: bool = False

    def validate(self) -> None:
        checks = [(self.time_limit_s > 0, "--time-limit must be positive"), (self.rate > 0, "--rate must be positive"),
                  (1 <= self.concurrency <= 256, "--concurrency must be 1..256"),
                  (1 <= self.consumers <= 64, "--consumers must be 1..64"),
                  (self.replicas in (1, 3, 5, 7), "--replicas must be 1, 3, 5 or 7"),
                  (1 <= self.message_groups <= 10_000, "--groups must be 1..10000"),
                  (self.interval_s > 0 and self.fault_s > 0, "--interval and --fault must be positive"),
                  (self.flush in FLUSH_TYPES, f"--flush must be one of {', '.join(FLUSH_TYPES)}"),
                  (self.expose_retention or self.retention_s == 0
                   or self.retention_s >= self.time_limit_s + self.drain_s,
                   "--retention-s must be 0 (the broker's 72 h) or at least --time-limit + --drain: a message must "
                   "not expire by the true time before the drain has consumed it"),
                  (not self.expose_retention or self.retention_s >= self.fault_s + HOLD_AFTER_HEAL_S
                   + CATCH_UP_MARGIN_S, f"--expose-retention needs --retention-s of at least --fault + "
                   f"{HOLD_AFTER_HEAL_S + CATCH_UP_MARGIN_S:.0f} s: what a fault's time took must not expire by the "
                   "true time before the consumers, held until just after it, take it")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        missing = workload_unavailable(self.workload)
        if missing:
            raise ValueError(missing)
        if "disk" in self.nemesis and self.disk_mib == 0:
            self.disk_mib = 256
        if self.disk_mib and not 64 <= self.disk_mib <= 65536:
            raise ValueError("--disk-mib must be 64..65536")
        root = nemesis.needs_root(self.nemesis) + (["disk"] if self.disk_mib else [])
        if root and os.geteuid() != 0:
            raise ValueError(f"the {', '.join(sorted(set(root)))} nemesis needs root (nftables, tc, tmpfs mounts)")


@dataclass
class FaultWindow:
    families: list[str]
    description: str
    start_s: float
    end_s: float | None = None
    error: str = ""
    leaderless_s: float | None = None  # the longest a kill of this fault left the group without a master (memberkill)
    ack_gap_s: float | None = None  # the longest time without an acknowledged send inside this window (history)


class Clients:
    """The client processes, run on an asyncio loop in a thread of their own; the main thread drives phases."""

    def __init__(self, cfg: RunConfig, workload: Workload, recorder: Recorder, namesrv: str):
        self.cfg, self.workload, self.recorder, self.namesrv = cfg, workload, recorder, namesrv
        self.sending = threading.Event()
        self.consuming = threading.Event()
        self.may_consume = threading.Event()  # cleared while expose_retention holds them
        self.may_send = threading.Event()
        self.acked: set[str] = set()
        self.consumed: set[str] = set()
        self.sends_in_flight = 0  # invoked and not yet answered (written on the clients' loop, read by the drain)
        self.last_delivery_s = 0.0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="clients", daemon=True)
        self.done: asyncio.Future | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        self.sending.set()
        self.consuming.set()
        self.may_consume.set()
        self.may_send.set()
        self.thread.start()
        self.done = asyncio.run_coroutine_threadsafe(self._main(), self.loop)
        if not self.ready.wait(timeout_s) or self.error:
            raise RuntimeError(f"the clients did not start: {self.error or f'not within {timeout_s:.0f}s'}")

    def stop_sending(self) -> None:
        self.sending.clear()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.sending.clear()
        self.consuming.clear()
        if self.done is not None:
            try:
                self.done.result(timeout_s)
            except Exception as exc:  # noqa: BLE001 - reported, and the run goes on to its checks
                log.warning("clients ended with %s: %s", type(exc).__name__, exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def complete(self) -> bool:
        """No send is still in flight (one may yet be acknowledged) and every acknowledged one was consumed."""
        return self.sends_in_flight == 0 and self.acked <= self.consumed

    async def _main(self) -> None:
        cfg = self.cfg
        senders, receivers = [], []
        try:
            senders = [await self.workload.sender(self.namesrv) for _ in range(cfg.concurrency)]
            receivers = [await self.workload.consumer(self.namesrv) for _ in range(cfg.consumers)]
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            try:  # what the workload started (the remoting workload's driver processes) stops now
                await asyncio.wait_for(self.workload.close(), 30)
            except Exception as close_exc:  # noqa: BLE001 - the start's failure is the one reported
                log.debug("closing the workload after a failed start: %s", close_exc)
            raise
        self.ready.set()
        tasks = [self._send_loop(p, c) for p, c in enumerate(senders)]
        tasks += [self._consume_loop(cfg.concurrency + p, c) for p, c in enumerate(receivers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for client in [*senders, *receivers]:
                try:
                    await asyncio.wait_for(client.close(), 10)
                except Exception as exc:  # noqa: BLE001
                    log.debug("closing a client: %s", exc)
            await self.workload.close()

    async def _send_loop(self, process: int, client) -> None:
        rng = random.Random(self.cfg.seed * 1000 + process)
        loop = asyncio.get_running_loop()
        interval = self.cfg.concurrency / self.cfg.rate
        next_at = loop.time() + rng.random() * interval
        n = 0
        while self.sending.is_set():
            if not self.may_send.is_set():
                await asyncio.sleep(0.05)
                next_at = loop.time()
                continue
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + interval, loop.time())  # a process that fell behind does not burst
            if not self.sending.is_set():
                break
            value = {"id": f"p{process}-{n}", "group": f"g{rng.randrange(self.cfg.message_groups)}", "topic": TOPIC}
            n += 1
            await self._send_one(process, client, value)

    async def _send_one(self, process: int, client, value: dict) -> None:
        self.recorder.record(process, "invoke", "send", value)
        self.sends_in_flight += 1
        try:
            extra = await asyncio.wait_for(client.send(value), SEND_OP_TIMEOUT_S)
        except TimeoutError:
            self.recorder.record(process, "info", "send", value, f"no answer within {SEND_OP_TIMEOUT_S:.0f}s")
        except Exception as exc:  # noqa: BLE001 - every failure is recorded as fail or info
            self.recorder.record(process, client.outcome(exc), "send", value, f"{type(exc).__name__}: {exc}")
        else:
            self.recorder.record(process, "ok", "send", {**value, **extra})
            self.acked.add(value["id"])
        finally:
            self.sends_in_flight -= 1

    async def _consume_loop(self, process: int, client) -> None:
        while self.consuming.is_set():
            if not self.may_consume.is_set():
                await asyncio.sleep(0.1)
                continue
            self.recorder.record(process, "invoke", "consume", None)
            try:
                deliveries = await asyncio.wait_for(client.receive(), RECEIVE_OP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - nothing was handed to this client: a certain failure
                self.recorder.record(process, "fail", "consume", None, f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)
                continue
            self.recorder.record(process, "ok", "consume", deliveries)  # recorded before the ack: FIFO order
            if deliveries:
                self.consumed.update(d["id"] for d in deliveries)
                self.last_delivery_s = time.monotonic()
            await client.ack()


class Run:
    def __init__(self, cfg: RunConfig):
        cfg.validate()
        self.cfg = cfg
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = os.path.abspath(os.path.join(
            cfg.out_dir, f"{cfg.workload}-{'+'.join(cfg.nemesis).replace(':', '.') or 'none'}-{stamp}-{cfg.seed}"))
        os.makedirs(self.dir, exist_ok=True)
        self.history_path = os.path.join(self.dir, "history.jsonl")
        self.rng = random.Random(cfg.seed)
        self.faults: list[FaultWindow] = []
        self.nemeses = {name: nemesis.make(name) for name in cfg.nemesis}
        retention = {"fileReservedTime": cfg.retention_s / 3600, "cleanResourceInterval": RETENTION_CHECK_MS
                     } if cfg.retention_s else {}
        self.cluster = ChaosCluster(os.path.join(self.dir, "cluster"), cfg.replicas, cfg.disk_mib,
                                    broker_settings=retention, flush=cfg.flush,
                                    clock_shifts=any(f in nemesis.CLOCKS for f in cfg.nemesis))
        self.recorder = Recorder(self.history_path)
        self.workload = make_workload(cfg.workload, cfg.concurrency + cfg.consumers + 4,
                                      os.path.join(self.dir, "clients"))
        self.notes: list[str] = []
        netem = self.nemeses.get("netem")
        if netem is not None and netem.delay_unavailable:
            self.notes.append(f"netem: packet loss only; delay unavailable: {netem.delay_unavailable}")

    def execute(self) -> dict:
        clients = None
        audit_result = None
        error = ""
        try:
            log.info("run directory %s", self.dir)
            self.cluster.start()
            self.cluster.dev.create_topic(TOPIC, message_types=(MessageType.FIFO,))
            self.cluster.dev.create_group(CONSUMER_GROUP, fifo=True)
            clients = Clients(self.cfg, self.workload, self.recorder, self.workload.namesrv(self.cluster))
            clients.start()
            self._chaos(clients)
            self._drain(clients)
            clients.stop()
            clients = None
            self.cluster.stop()
            if self.cfg.audit:
                audit_result = self._audit()
        except KeyboardInterrupt:
            error = "interrupted"
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.exception("the run failed")
        finally:
            if clients is not None:
                clients.stop(10)
            self.cluster.close()
            self.recorder.close()
            self._close_windows()
        return self._results(audit_result, error)

    # -- phases -----------------------------------------------------------------------------------------------
    def _chaos(self, clients: Clients) -> None:
        deadline = time.monotonic() + self.cfg.time_limit_s
        log.info("chaos for %.0fs: nemesis %s", self.cfg.time_limit_s, ", ".join(self.cfg.nemesis) or "none")
        while time.monotonic() < deadline:
            _sleep_until(min(deadline, time.monotonic() + self.cfg.interval_s * self.rng.uniform(0.5, 1.5)))
            if time.monotonic() >= deadline or not self.nemeses:
                continue
            chosen = self._choose()
            expose = self.cfg.expose_retention
            if expose:
                self._expose(clients, chosen)
            window, active = self._inject(chosen)
            if expose:  # the clients' routes follow a new master before they send (else a forwarding replica stamps)
                _sleep_until(time.monotonic() + max(getattr(self.nemeses[f], "settle_s", 0.0) for f in chosen))
            clients.may_send.set()
            _sleep_until(min(deadline, time.monotonic() + self.cfg.fault_s) if not expose
                         else time.monotonic() + self.cfg.fault_s)
            self._heal(window, active)
            if expose:
                _sleep_until(time.monotonic() + HOLD_AFTER_HEAL_S)
                clients.may_consume.set()

    def _choose(self) -> list[str]:
        families = list(self.nemeses)
        count = 2 if self.cfg.combine and len(families) > 1 and self.rng.random() < 1 / 3 else 1
        return self.rng.sample(families, count)

    def _expose(self, clients: Clients, chosen: list[str]) -> None:
        """--expose-retention: everything sent so far expires (the consumers take it first); then the consumers stop,
        and the senders send for the faults' backlog_s before the faults (a backlog that a clock ahead would delete)
        or not at all (what the faults' time stamps heads every queue: a clock behind would make it look old)."""
        clients.may_send.clear()
        _sleep_until(time.monotonic() + self.cfg.retention_s + 2 * RETENTION_CHECK_MS / 1000 + 1)
        clients.may_consume.clear()
        backlog_s = max(getattr(self.nemeses[family], "backlog_s", 0.0) for family in chosen)
        if backlog_s:
            clients.may_send.set()
            _sleep_until(time.monotonic() + backlog_s)

    def _inject(self, chosen: list[str]) -> tuple[FaultWindow, list[nemesis.ActiveFault]]:
        window = FaultWindow(chosen, "", self.recorder.now_ns() / 1e9)
        active = []
        for family in chosen:
            try:
                active.append(self.nemeses[family].inject(self.cluster, self.rng))
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
                window.error += f"{family}: {type(exc).__name__}: {exc}; "
                log.warning("could not inject %s: %s", family, exc)
        window.description = "; ".join(f.description for f in active) or "(nothing injected)"
        self.faults.append(window)
        log.info("%7.1fs  fault: %s", window.start_s, window.description)
        return window, active

    def _heal(self, window: FaultWindow, active: list[nemesis.ActiveFault]) -> None:
        for fault in active:
            try:
                fault.heal()
            except Exception as exc:  # noqa: BLE001
                window.error += f"heal {fault.family}: {type(exc).__name__}: {exc}; "
                log.warning("healing %s failed (%s); healing everything", fault.family, exc)
                self.cluster.heal_everything()
        window.end_s = self.recorder.now_ns() / 1e9
        window.description = "; ".join(f.description for f in active) or window.description  # what the heal did
        measured = [f.leaderless_s for f in active if f.leaderless_s is not None]
        window.leaderless_s = max(measured) if measured else None
        log.info("%7.1fs  healed%s", window.end_s, f" ({window.description})" if measured else "")

    def _drain(self, clients: Clients) -> None:
        clients.stop_sending()
        self.cluster.heal_everything()  # also restarts a killed replica whose restart failed
        clients.may_consume.set()
        deadline = time.monotonic() + self.cfg.drain_s
        log.info("drain: waiting for %d acknowledged messages to be consumed (at most %.0fs)",
                 len(clients.acked), self.cfg.drain_s)
        while time.monotonic() < deadline:
            quiet = time.monotonic() - clients.last_delivery_s >= self.cfg.quiet_s
            if clients.complete() and quiet:
                break
            time.sleep(0.2)
        missing = len(clients.acked - clients.consumed)
        log.info("drain done: %d acknowledged, %d consumed, %d not (yet) consumed", len(clients.acked),
                 len(clients.consumed), missing)

    def _audit(self) -> dict:
        """The Spark audit as a process of its own (`python -m audit`; jepsen_tests and audit do not import each
        other); its report is the audit.json it writes."""
        if importlib.util.find_spec("pyspark") is None:
            return {"valid": False, "error": "the audit needs pyspark: pip install -e '.[audit]'"}
        log.info("audit: Spark (%s) over the replicas' stores", self.cfg.audit_master)
        self.recorder.flush()
        out_dir = os.path.join(self.dir, "audit")
        os.makedirs(out_dir, exist_ok=True)
        log_path = os.path.join(out_dir, "audit.log")
        command = [sys.executable, "-m", "audit", "--cluster-dir", self.cluster.dev.base_dir, "--history",
                   self.history_path, "--out", out_dir, "--master", self.cfg.audit_master]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(log_path, "wb") as output:
            try:
                code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                      timeout=AUDIT_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                return {"valid": False, "error": f"the audit did not end in {AUDIT_TIMEOUT_S:.0f} s; see {log_path}"}
        report_path = os.path.join(out_dir, "audit.json")
        if code == AUDIT_BAD_INPUT_EXIT:
            return {"valid": False, "error": f"the audit could not read its input: {_audit_message(log_path)}"}
        if code not in (EXIT_VALID, EXIT_INVALID) or not os.path.exists(report_path):
            return {"valid": False, "error": f"the audit failed (exit code {code}); see {log_path}"}
        with open(report_path) as f:
            report = json.load(f)
        log.info("audit: %s in %.1f s", "valid" if report["valid"] else "INVALID", report["spark"]["wall_s"])
        return report

    def _close_windows(self) -> None:
        for window in self.faults:
            if window.end_s is None:
                window.end_s = self.recorder.now_ns() / 1e9

    # -- results -----------------------------------------------------------------------------------------------
    def _results(self, audit_result: dict | None, error: str) -> dict:
        # what the workload's client promises (workloads.py): order per message group, and per queue in offsets
        checks = {"group_order": self.workload.group_order, "queue_order": self.workload.queue_order}
        result = checker.check(self.recorder.ops, **checks)
        for window in self.faults:
            window.ack_gap_s = checker.longest_gap(self.recorder.ops, window.start_s, window.end_s)
        valid = result.valid and not error and (audit_result is None or bool(audit_result.get("valid")))
        results = {
            "valid": valid, "error": error, "config": asdict(self.cfg), "checks": checks, "directory": self.dir,
            "history": self.history_path, "operations": len(self.recorder.ops),
            "duration_s": round(self.recorder.now_ns() / 1e9, 3), "notes": self.notes,
            "faults": [asdict(w) for w in self.faults], "checker": result.summary(),
            "audit": _audit_summary(audit_result)}
        with open(os.path.join(self.dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        report.write_html(os.path.join(self.dir, "report.html"), results, self.recorder.ops)
        return results


def _audit_summary(audit_result: dict | None) -> dict | None:
    if audit_result is None:
        return None
    return {k: v for k, v in audit_result.items() if k in ("valid", "error", "checks", "groups", "totals", "spark")}


def _audit_message(log_path: str) -> str:
    """The reason `python -m audit` printed for refusing its input (its last line starting "audit: ")."""
    with open(log_path, errors="replace") as f:
        lines = [line.strip() for line in f if line.startswith("audit: ")]
    return lines[-1].removeprefix("audit: ") if lines else f"see {log_path}"


def _sleep_until(when: float) -> None:
    while (left := when - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def run(cfg: RunConfig) -> tuple[int, dict]:
    """Run once; (exit code, results). SIGTERM and SIGHUP (a closed terminal or ssh session) are turned into
    KeyboardInterrupt so the cleanup still runs: nftables table, qdisc on lo, tmpfs mounts, processes."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in INTERRUPTING_SIGNALS} if on_main_thread else {}
    try:
        results = Run(cfg).execute()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    audit, checked = results["audit"] or {}, results["checker"]
    if (not checked["valid"] and not checked["error"]) or (audit and not audit.get("valid") and not audit.get("error")):
        return EXIT_INVALID, results  # a violation outranks a harness failure
    if results["error"] or audit.get("error") or checked["error"]:
        return EXIT_HARNESS, results
    return EXIT_VALID, results


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
