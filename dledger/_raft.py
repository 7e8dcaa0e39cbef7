"""The Raft engine: pysyncobj 0.3.x behind one seam. Nothing else in rocketraft imports pysyncobj.

What this module changes in pysyncobj, and why (each one pinned by tests/dledger/test_raft_seam.py):
- Journal: `pysyncobj.syncobj.createJournal` is wrapped so a replica's SyncObj gets our LMDB journal
  (its FileJournal keeps every entry in a Python list and never fsyncs).
- Wire format: messages are pickled with the highest protocol instead of 2 (protocol 2 turns every
  bytes payload into a latin-1 str: ~1.6x size and CPU) and not zlib-compressed (CPU on 2 cores).
  Connection buffers are bytearrays: pysyncobj's bytes `+=` copied the whole pending buffer on every
  socket read, which starved followers under load.
- Outgoing peer sockets bind to the replica's own address, so a peer is one IP on the wire and a
  firewall rule can cut exactly one replica off (tests use 127.0.0.11-13).
- Timing: pysyncobj either sends one append_entries per command and per follower
  (appendEntriesUseBatch=False) or only once per heartbeat period (True: >= 100 ms per commit). We
  run it in batch mode and send ourselves at the end of every tick that added entries or advanced
  the commit index: one message per follower per tick, with every new entry. Appends wake the tick
  thread through our own pipe. The leader steps down after `leader_fallback_ms` without a majority
  (not 30 s); failed connects are retried every `connection_retry_ms` (not 5 s).
- Elections: pre-vote (Raft thesis 9.6). A replica whose election timer fires first asks its peers
  whether they would vote; only with a majority does pysyncobj start a real election. Peers refuse
  while they still hear from a leader, so a flapping connection or a partitioned minority never bumps
  the term. A follower whose connection to the leader is reset (the leader process died) starts a
  pre-vote at once instead of waiting for the full timeout.
- Durability: we drive the tick loop ourselves (autoTick=False). Every tick, just before pysyncobj
  polls its sockets, the pending LMDB transaction (journal appends + state-machine applies + applied
  index) is committed (under SYNC_FLUSH: LMDB's synchronous commit, see store.py), and only then
  are append futures resolved. A follower holds its success acknowledgements until pysyncobj's poll
  has handled every ready message, commits once, then sends them: one durable commit per burst of
  append_entries, not one per message. Whatever a poll wrote is committed before the next tick's
  commit computation counts this replica.
- Restart: the applied index is read from LMDB and handed to pysyncobj before the first tick, so no
  entry is applied twice and restart time does not grow with the log.
- Snapshots: pysyncobj's serializer hook ships a compacted LMDB copy of the whole store (retained log
  + state machine) to a follower that is behind the leader's first log index.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import pickle
import queue
import random
import socket as _socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pysyncobj.pickle as _pso_pickle
import pysyncobj.syncobj as _pso_syncobj
import pysyncobj.tcp_connection as _pso_tcp
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import TCPTransport

from . import logformat
from .codec import decode_batch
from .config import FlushPolicy, ReplicaConfig
from .journal import LmdbJournal
from .store import Store

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION_RANGE = ("0.3.17", "0.4")
# The `error` of an apply_command_response by which a leader refuses a forwarded append: (REFUSED, code, text).
# pysyncobj hands any `error` to the follower's callback as its fail reason; Replica turns this one into
# AppendRefusedError.
REFUSED = "dl_refused"
NO_OP_COMMAND = 1

# -- seam 1: the journal --------------------------------------------------------------------------------
_pending_journals: dict[str, LmdbJournal] = {}
_pending_lock = threading.Lock()
_original_create_journal = _pso_syncobj.createJournal


def _create_journal(journal_file=None):
    with _pending_lock:
        journal = _pending_journals.pop(journal_file, None) if journal_file else None
    return journal if journal is not None else _original_create_journal(journal_file)


_pso_syncobj.createJournal = _create_journal

# -- seam 2: wire format ----------------------------------------------------------------------------------
_pso_pickle.__dict__["__protocol"] = pickle.HIGHEST_PROTOCOL



# -- seam 3: source-bound outgoing sockets ----------------------------------------------------------------
_thread_source = threading.local()


class _SourceBoundSocketModule:
    """The `socket` module as pysyncobj.tcp_connection sees it: sockets it creates on a replica's tick
    thread are bound to that replica's own IP before they connect."""

    def __getattr__(self, name):
        return getattr(_socket, name)

    @staticmethod
    def socket(*args, **kwargs):
        sock = _socket.socket(*args, **kwargs)
        source_ip = getattr(_thread_source, "ip", None)
        if source_ip:
            sock.bind((source_ip, 0))
        return sock


_pso_tcp.socket = _SourceBoundSocketModule()


# -- seam 4: linear-time connection buffers -------------------------------------------------------------------
# pysyncobj keeps each connection's read and write buffers as bytes and grows them with `+=` and shrinks
# them with slicing: every socket read copies the whole pending buffer, so a 4 MiB message arriving in
# 64 KiB reads costs ~128 MiB of copying, and followers starved the CPU under load. Same wire format,
# bytearray buffers (append and front-deletion are amortised O(1) in CPython).
_Conn = _pso_tcp.TcpConnection
_FRAME = struct.Struct("i")  # pysyncobj's length prefix: native int


def _conn_send(self, message):
    if self.sendRandKey:
        message = (self.sendRandKey, message)
    data = _pso_pickle.dumps(message)
    if self.encryptor:
        data = self.encryptor.encrypt_at_time(data, int(_pso_tcp.monotonicTime()))
    buf = self._TcpConnection__writeBuffer
    if type(buf) is not bytearray:
        buf = self._TcpConnection__writeBuffer = bytearray(buf)
    buf += _FRAME.pack(len(data))
    buf += data
    self._TcpConnection__trySendBuffer()


def _conn_process_send(self):
    buf = self._TcpConnection__writeBuffer
    if not buf:
        return False
    try:
        sent = self._TcpConnection__socket.send(buf)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if sent <= 0:
        if sent < 0:
            self.disconnect()
        return False
    if type(buf) is not bytearray:
        buf = self._TcpConnection__writeBuffer = bytearray(buf)
    del buf[:sent]
    return True


def _conn_process_read(self):
    sock = self._TcpConnection__socket
    try:
        incoming = sock.recv(self._TcpConnection__recvBufferSize)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if not incoming or sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR):
        self.disconnect()
        return False
    buf = self._TcpConnection__readBuffer
    if type(buf) is not bytearray:
        buf = self._TcpConnection__readBuffer = bytearray(buf)
    buf += incoming
    return True


def _conn_parse_message(self):
    buf = self._TcpConnection__readBuffer
    if len(buf) < 4:
        return None
    length = _FRAME.unpack_from(buf)[0]
    if len(buf) - 4 < length:
        return None
    data = bytes(buf[4:4 + length])
    try:
        if self.encryptor:
            timestamp = self.encryptor.extract_timestamp(data)
            if timestamp < self.recvLastTimestamp:
                raise ValueError("replayed or reordered encrypted message")
            self.recvLastTimestamp = timestamp
            data = self.encryptor.decrypt(data)
        message = _pso_pickle.loads(data)
        if self.recvRandKey:
            rand_key, message = message
            if rand_key != self.recvRandKey:
                raise ValueError("session key mismatch")
    except Exception as exc:  # noqa: BLE001 - like pysyncobj: a bad frame closes the connection
        log.warning("closing a peer connection: undecodable message of %d bytes (%r)", length, exc)
        self.disconnect()
        return None
    del buf[:4 + length]
    return message


for _name in ("_TcpConnection__processSend", "_TcpConnection__processRead", "_TcpConnection__processParseMessage",
              "_TcpConnection__trySendBuffer", "_TcpConnection__writeBuffer"):
    if _name != "_TcpConnection__writeBuffer" and not hasattr(_Conn, _name):
        raise RuntimeError(f"pysyncobj.tcp_connection changed ({_name} missing); dledger needs 0.3.x")
def _conn_check_timeout(self):
    idle_s = _pso_tcp.monotonicTime() - self._TcpConnection__lastReadTime
    if idle_s > self._TcpConnection__timeout:
        log.warning("closing a peer connection: nothing received for %.1f s", idle_s)
        self.disconnect()


_Conn.send = _conn_send
_Conn._TcpConnection__processConnectionTimeout = _conn_check_timeout
_Conn._TcpConnection__processSend = _conn_process_send
_Conn._TcpConnection__processRead = _conn_process_read
_Conn._TcpConnection__processParseMessage = _conn_parse_message


# -- roles ------------------------------------------------------------------------------------------------
class RaftState:
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


@dataclass(frozen=True)
class EngineView:
    """What the tick thread saw at the end of its last tick (read by other threads without locks)."""

    raft_state: int
    leader_ready: bool  # leader whose first entry of its term is applied
    term: int
    leader_address: str | None
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    durable_index: int
    match_index: dict
    connected_peers: tuple


class _Transport(TCPTransport):
    """pysyncobj's TCP transport plus the hooks dledger needs (flush-before-ack, pre-vote, fast failover)."""

    def send(self, node, message):
        engine = self._syncObj.dl_engine
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "next_node_idx" and message.get("success"):
                engine.hold_ack(node, message)  # sent after the store is committed (release_acks)
                return True
            if kind == "append_entries" and message.get("entries") and engine.hold_back(node, message):
                self.drain(node)
                return True
        engine.release_acks()  # keep held acks ahead of anything sent after them
        sent = super().send(node, message)
        self.drain(node)
        return sent

    def unsent_bytes(self, node) -> int:
        conn = self._connections.get(node)
        return conn.getSendBufferSize() if conn is not None else 0

    def drain(self, node) -> None:
        """pysyncobj leaves what the socket did not take in a buffer and only retries on the next send;
        ask the poller for a write event so the rest goes out as soon as the socket has room."""
        conn = self._connections.get(node)
        if conn is None or not conn.getSendBufferSize() or conn.fileno() is None:
            return
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR
        self._syncObj._poller.subscribe(conn.fileno(), conn._TcpConnection__processConnection, events)

    def is_connected(self, node) -> bool:
        conn = self._connections.get(node)
        return conn is not None and conn.state == _pso_tcp.CONNECTION_STATE.CONNECTED

    def _onIncomingMessageReceived(self, conn, message):  # noqa: N802
        # pysyncobj accepts unauthenticated utility commands (leadership transfer, membership, status)
        # and read-only nodes that receive the whole log on its Raft port; a replica group has neither.
        if isinstance(message, list) or message == "readonly":
            log.warning("refused a pysyncobj utility/read-only connection on the Raft port")
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)

    def send_now(self, node, message):
        return super().send(node, message)

    def _onMessageReceived(self, node, message):  # noqa: N802
        engine = self._syncObj.dl_engine
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in ("dl_prevote", "dl_prevote_resp"):
            engine.on_prevote_message(node, message)
            return
        if kind == "dl_snapshot_progress":
            return  # only there so the leader's connection sees traffic during a long transfer
        if kind == "apply_command" and self._syncObj._isLeader():
            refusal = engine.refusal_of_forwarded(message.get("command"))
            if refusal is not None:
                if "request_id" in message:
                    super().send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                        "error": (REFUSED, *refusal)})
                return
        if kind == "append_entries":
            engine.on_leader_contact(node, message["term"])
            message = engine.trim_known_entries(message)
            if message.get("serialized"):
                # pysyncobj acknowledges only the last chunk of a snapshot; without traffic the leader's
                # side would close the connection (connectionTimeout) during a long transfer.
                super().send(node, {"type": "dl_snapshot_progress"})
        super()._onMessageReceived(node, message)

    def _onNodeDisconnected(self, node):  # noqa: N802
        super()._onNodeDisconnected(node)
        self._syncObj.dl_engine.on_peer_disconnected(node)

    def _onNodeConnected(self, node):  # noqa: N802
        super()._onNodeConnected(node)
        self._syncObj.dl_engine.on_peer_connected(node)


class _BudgetedQueue:
    """pysyncobj's command queue, with a byte budget per tick.

    pysyncobj takes queued commands for up to one heartbeat period per tick, whatever their size: with
    large entries one tick appended over 100 MiB, whose commit and fsync then stalled the tick thread
    long enough for followers to time out. Once `budget_bytes` were taken in a tick, get_nowait reports
    empty until the next tick (reset_budget), and the wake-up pipe makes that tick come at once."""

    def __init__(self, max_size: int, budget_bytes: int, wakeup: Callable[[], None]):
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._max_size = max_size
        self._budget_bytes = budget_bytes
        self._taken_bytes = 0
        self._wakeup = wakeup

    def put_nowait(self, item) -> None:
        with self._lock:
            if len(self._queue) >= self._max_size:
                raise queue.Full()
            self._queue.append(item)

    def get_nowait(self):
        with self._lock:
            if not self._queue:
                raise queue.Empty()
            if self._taken_bytes >= self._budget_bytes:
                self._wakeup()
                raise queue.Empty()
            item = self._queue.popleft()
        self._taken_bytes += len(item[0])
        return item

    def reset_budget(self) -> None:
        self._taken_bytes = 0


class _SyncObj(SyncObj):
    def __init__(self, engine: RaftEngine, self_addr: str, other_addrs: list[str], conf: SyncObjConf):
        self.dl_engine = engine
        super().__init__(self_addr, other_addrs, conf=conf, transportClass=_Transport)

    @replicated
    def dl_apply(self, blob):
        return self.dl_engine.apply_blob(blob)


ApplyFn = Callable[[int, int, bytes, object], object]  # (index, term, blob, txn) -> result


class RaftEngine:
    """One Raft replica: pysyncobj, the tick thread, durability points, pre-vote and snapshots."""

    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal, applied_index: int,
                 apply_fn: ApplyFn, after_tick: Callable[[EngineView], None],
                 record_applied: Callable[[int, object], None], on_failure: Callable[[BaseException], None],
                 snapshot_hooks=None):
        self.config = config
        self._on_failure = on_failure
        self.store = store
        # (payloads getter) -> None to admit, or (code, reason) to refuse an append forwarded to this leader
        self.admission: Callable[[Callable[[], list[bytes]]], tuple[str, str] | None] | None = None
        self.journal = journal
        self._apply_fn = apply_fn
        self._after_tick = after_tick
        self._record_applied = record_applied
        self._snapshot_hooks = snapshot_hooks
        self._deferred: list[tuple[Callable, object, int]] = []
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._committed_last_index = 0
        self._async_durable_index = 0
        self._recorded_applied = applied_index
        self._leader_contact_at = 0.0
        self._lost_leader: str | None = None
        self._prevote: dict | None = None
        self._prevote_granted_term = -1
        self._self_ip = config.self_address.rpartition(":")[0]
        self._held_acks: list = []
        self._throttled: set = set()
        self._sent_last_index = 0
        self._sent_commit_index = 0
        self._sent_commit_at = 0.0
        self.stats = {"acks_sent": 0, "acks_beyond_durable": 0, "commits_checked": 0,
                      "commits_beyond_durable": 0, "prevote_rounds": 0, "elections_started": 0,
                      "snapshots_installed": 0, "sends_held_back": 0}
        self._journal_token = f"dledger-journal:{config.group_id}:{config.self_id}:{id(self)}"
        with _pending_lock:
            _pending_journals[self._journal_token] = journal
        self._address_to_id = {addr: pid for pid, addr in config.peers.items()}
        others = [addr for pid, addr in sorted(config.peers.items()) if pid != config.self_id]
        self.so = _SyncObj(self, config.self_address, others, self._pysyncobj_conf())
        self._check_seam()
        # Never re-apply what LMDB says is applied; never load pysyncobj's dump file at start.
        self.so._SyncObj__raftLastApplied = max(applied_index, 1)
        self.so._SyncObj__needLoadDumpFile = False
        self._func_id = self.so._methodToID[self.so._getFuncName("dl_apply")]
        self._wakeup = PipeNotifier(self.so._poller)
        self._throttle_snapshot_chunks()
        self._commands = _BudgetedQueue(config.append_queue_max, config.append_bytes_per_tick_max, self.wake)
        self.so._SyncObj__commandsQueue = self._commands
        self.store.commit(fsync=True)  # pysyncobj may have written its initial entry on this thread
        self.view = self._make_view()
        self._thread = threading.Thread(target=self._run, name=f"raft-{config.group_id}-{config.self_id}",
                                        daemon=True)

    def _pysyncobj_conf(self) -> SyncObjConf:
        c = self.config
        hb = c.heartbeat_interval_ms / 1000
        snapshot = self._snapshot_hooks
        conf = SyncObjConf(
            autoTick=False,
            journalFile=self._journal_token,
            appendEntriesUseBatch=True,  # we send at the end of every tick (see _send_new_entries)
            appendEntriesPeriod=hb,
            raftMinTimeout=c.election_timeout_min_ms / 1000,
            raftMaxTimeout=c.election_timeout_max_ms / 1000,
            leaderFallbackTimeout=c.leader_fallback_ms / 1000,
            connectionTimeout=max(c.election_timeout_max_ms / 1000 * 2, 2.0),
            connectionRetryTime=c.connection_retry_ms / 1000,
            # Above the largest entry we ever build: pysyncobj's chunked path for bigger entries is broken.
            appendEntriesBatchSizeBytes=c.entry_bytes_max + 64 * 1024,
            commandsQueueSize=c.append_queue_max,
            commandsWaitLeader=False,
            bindAddress=c.self_address,
            sendBufferSize=c.socket_buffer_bytes,
            recvBufferSize=c.socket_buffer_bytes,
            password=c.password,
            # Compaction is triggered by dledger only (retention is a broker policy), never by count/time.
            logCompactionMinEntries=2**62,
            logCompactionMinTime=10**12,
            logCompactionBatchSize=c.snapshot_chunk_bytes,
            fullDumpFile=os.path.join(c.data_dir, "snapshot.mdb") if snapshot else None,
            serializer=snapshot.serialize if snapshot else None,
            deserializer=snapshot.deserialize if snapshot else None,
            serializeChecker=snapshot.check if snapshot else None,
            useFork=False,
            dynamicMembershipChange=False,
        )
        return conf

    def _check_seam(self) -> None:
        """Fail loudly if this pysyncobj does not have the internals this module relies on."""
        for name in ("_SyncObj__raftLastApplied", "_SyncObj__needLoadDumpFile", "_SyncObj__raftElectionDeadline",
                     "_SyncObj__raftState", "_SyncObj__noopIDx", "_SyncObj__raftLog", "_SyncObj__raftMatchIndex",
                     "_SyncObj__commandsQueue", "_SyncObj__raftNextIndex", "_SyncObj__connectedNodes",
                     "_SyncObj__transport", "_SyncObj__sendAppendEntries", "_SyncObj__serializer",
                     "_SyncObj__votedForNodeId"):
            if not hasattr(self.so, name):
                raise RuntimeError(f"pysyncobj internals changed ({name} missing); dledger supports "
                                   f"pysyncobj {PYSYNCOBJ_VERSION_RANGE[0]} up to {PYSYNCOBJ_VERSION_RANGE[1]}")
        if self.so._SyncObj__raftLog is not self.journal:
            raise RuntimeError("pysyncobj did not take the LMDB journal (createJournal seam failed)")

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        if self.config.flush_policy is FlushPolicy.ASYNC_FLUSH:
            threading.Thread(target=self._flush_loop, name=f"dledger-flush-{self.config.self_id}",
                             daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def _run(self) -> None:
        _thread_source.ip = self._self_ip
        self.store.bind_writer()
        self.so.addOnTickCallback(self._on_tick_end)
        wait_s = min(0.01, self.config.heartbeat_interval_ms / 5000)
        try:
            while not self._stop.is_set():
                self._commands.reset_budget()
                # What the last poll wrote (a new leader's first entry) is on disk before pysyncobj's next
                # commit computation counts this replica for it.
                self._commit_store()
                self._pre_tick()
                self.so.doTick(wait_s)
                self.release_acks()
                self._restore_throttled()
        except BaseException as exc:  # a broken invariant stops the replica loudly
            self._failed = exc
            log.critical("replica %s/%s stopped: %r", self.config.group_id, self.config.self_id, exc,
                         exc_info=True)
            self._fail_deferred(exc)
        finally:
            try:
                self.so._doDestroy()
            except Exception:  # noqa: BLE001 - best effort while stopping
                log.exception("error while closing the Raft transport")
            if self._failed is None:
                self.store.commit(fsync=True)
            else:
                self.store.abort()

    # -- submitting ----------------------------------------------------------------------------------
    def refusal_of_forwarded(self, command) -> tuple[str, str] | None:
        """On the leader, for an append a follower forwarded: (code, reason) if the admission check refuses
        it, else None. Local appends are not asked (their caller checked before appending)."""
        admission = self.admission
        if admission is None or not isinstance(command, bytes):
            return None

        def payloads() -> list[bytes]:  # decoded only if the admission needs to look (it usually admits at once)
            blob = logformat.decode_command(command)
            return [] if blob is None else decode_batch(blob)

        try:
            return admission(payloads)
        except Exception:  # noqa: BLE001 - a broken check must not stop the leader: admit, and say so
            log.exception("the append admission check failed; admitting the forwarded append")
            return None

    def submit(self, blob: bytes, callback: Callable[[object, int], None]) -> None:
        """Append one Raft entry carrying blob; callback(result, fail_reason) runs on the tick thread."""
        command = logformat.encode_call(self._func_id, blob)

        def on_result(result, reason):
            if threading.get_ident() == self._thread.ident:
                self.defer(callback, result, reason)  # resolved once the tick's LMDB commit is done
            else:
                callback(result, reason)  # refused synchronously (queue full): nothing to wait for

        self.so._applyCommand(command, on_result, 0)
        self.wake()

    def wake(self) -> None:
        try:
            self._wakeup.notify()
        except BlockingIOError:
            pass  # the wake-up pipe is full: the tick thread is already due to run

    # -- apply -----------------------------------------------------------------------------------------
    def apply_blob(self, blob: bytes):
        index = self.so._SyncObj__raftLastApplied + 1
        term = self.journal.entry(index)[2]
        txn = self.store.write_txn()
        result = self._apply_fn(index, term, blob, txn)
        self._record_applied(index, txn)
        self._recorded_applied = index
        return (index, term, result)

    # -- tick hooks -------------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Stop the replica at the start of the next tick (used where pysyncobj would swallow errors)."""
        self._failed = self._failed or exc

    def snapshot_installed(self, applied_index: int) -> None:
        """The store was replaced by the leader's copy: its Raft metadata is the leader's, not ours.
        Write back our own term and vote (a replica must never forget a vote) and a commit index that
        does not pass the installed log."""
        so = self.so
        journal = self.journal
        journal.setRaftCommitIndex(min(journal.getRaftCommitIndex(), journal.last_index))
        journal.setCurrentTerm(so.raftCurrentTerm, so._SyncObj__votedForNodeId)
        self._recorded_applied = applied_index
        self.stats["snapshots_installed"] += 1

    def _pre_tick(self) -> None:
        if self._failed is not None:
            raise self._failed
        if not self.config.pre_vote:
            return
        so = self.so
        if so._SyncObj__raftState == RaftState.LEADER:
            self._prevote = None
            return
        now = time.monotonic()
        if so._SyncObj__raftElectionDeadline > now:
            return
        term = so.raftCurrentTerm
        if self._prevote_granted_term == term:
            self.stats["elections_started"] += 1
            return  # a majority said it would vote: let pysyncobj run the election now
        self._start_prevote(term, now)

    def _start_prevote(self, term: int, now: float) -> None:
        so = self.so
        c = self.config
        log.info("election timer fired in term %d (leader %s, last contact %.0f ms ago): pre-vote", term,
                 so._getLeader(), (now - self._leader_contact_at) * 1000 if self._leader_contact_at else -1)
        self._prevote = {"term": term + 1, "votes": {c.self_address}}
        self.stats["prevote_rounds"] += 1
        last = self.journal[-1]
        message = {"type": "dl_prevote", "term": term + 1, "last_log_index": last[1], "last_log_term": last[2]}
        for node in so.otherNodes:
            so._SyncObj__transport.send(node, message)
        timeout = random.uniform(c.election_timeout_min_ms, c.election_timeout_max_ms) / 1000
        so._SyncObj__raftElectionDeadline = now + timeout
        self._maybe_prevote_won()

    def _maybe_prevote_won(self) -> None:
        if self._prevote and len(self._prevote["votes"]) * 2 > len(self.config.peers):
            self._prevote_granted_term = self._prevote["term"] - 1
            self._prevote = None
            self.so._SyncObj__raftElectionDeadline = 0

    def on_prevote_message(self, node, message: dict) -> None:
        so = self.so
        if message["type"] == "dl_prevote":
            last = self.journal[-1]
            log_ok = (message["last_log_term"], message["last_log_index"]) >= (last[2], last[1])
            leader_alive = self._leader_alive()
            # >= (not >): a peer that already adopted the candidate's term from a failed election must
            # still grant, or a replica with the longest log could never become leader.
            granted = message["term"] >= so.raftCurrentTerm and log_ok and not leader_alive
            log.debug("pre-vote for %s in term %d: %s (my term %d, log ok %s, leader alive %s)", node.address,
                     message["term"], "granted" if granted else "refused", so.raftCurrentTerm, log_ok, leader_alive)
            so._SyncObj__transport.send(node, {"type": "dl_prevote_resp", "term": message["term"],
                                               "granted": granted})
        elif self._prevote and message["term"] == self._prevote["term"] and message["granted"]:
            self._prevote["votes"].add(node.address)
            self._maybe_prevote_won()

    def _leader_alive(self) -> bool:
        so = self.so
        if so._SyncObj__raftState == RaftState.LEADER:
            return True
        leader = so._getLeader()
        if leader is None or not so.isNodeConnected(leader):
            return False
        return time.monotonic() - self._leader_contact_at < self.config.election_timeout_min_ms / 1000

    def on_leader_contact(self, node, term: int) -> None:
        if term >= self.so.raftCurrentTerm:
            self._leader_contact_at = time.monotonic()
            # A leader is alive: a pre-vote round (or its result) must not start an election now.
            self._prevote = None
            self._prevote_granted_term = -1
            self._lost_leader = None

    def trim_known_entries(self, message: dict) -> dict:
        """Rewrite an append_entries so pysyncobj never truncates entries that do not conflict.

        pysyncobj deletes everything after prevLogIdx and re-appends, even when the entries match, and
        a heartbeat whose prevLogIdx is behind our log (the leader's next index went back: flow control,
        a resend after a snapshot) truncates entries we already acknowledged. Raft deletes only on a
        conflict. By the log matching property an entry with the same index and term implies an equal
        prefix, so (1) leading entries we hold with the same term are dropped and prevLogIdx moves to the
        last of them; (2) if nothing new remains and our last entry has the leader's current term, our
        whole log came from this leader (one leader per term), so prevLogIdx moves to our last entry."""
        if "prevLogIdx" not in message or "transmission" in message:
            return message
        journal = self.journal
        entries = message.get("entries") or []
        prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        known = 0
        for _command, idx, term in entries:
            if not journal.first_index <= idx <= journal.last_index or journal.entry(idx)[2] != term:
                break
            known += 1
        if known:
            prev_idx, prev_term = entries[known - 1][1], entries[known - 1][2]
        remaining = entries[known:]
        last_idx = journal.last_index
        if (not remaining and prev_idx < last_idx and journal.first_index <= prev_idx
                and journal.entry(prev_idx)[2] == prev_term and journal.entry(last_idx)[2] == message["term"]):
            prev_idx, prev_term = last_idx, message["term"]
        if prev_idx == message["prevLogIdx"] and not known:
            return message
        rewritten = dict(message)
        rewritten["prevLogIdx"], rewritten["prevLogTerm"], rewritten["entries"] = prev_idx, prev_term, remaining
        return rewritten

    def on_peer_connected(self, node) -> None:
        """A peer (re)connected after we lost the leader: a pre-vote that could not reach it may win now,
        so ask again soon (in rank order) instead of after a full election timeout."""
        so = self.so
        if self._lost_leader is None or so._SyncObj__raftState == RaftState.LEADER or self._leader_alive():
            return
        self._schedule_prevote(self._lost_leader)

    def on_peer_disconnected(self, node) -> None:
        so = self.so
        if so._SyncObj__raftState != RaftState.LEADER and so._getLeader() == node:
            # The leader's process is gone (or its link reset): ask for votes soon, not after the timeout.
            self._leader_contact_at = 0.0
            self._lost_leader = node.address
            delay_s = self._schedule_prevote(node.address)
            log.info("connection to the leader %s lost: pre-vote in %.0f ms", node.address, delay_s * 1000)

    def _schedule_prevote(self, lost_leader: str) -> float:
        """Survivors go one after the other, in replica-id order, so two of them rarely become candidates
        at once (a split vote costs a whole election timeout)."""
        survivors = sorted(pid for pid, addr in self.config.peers.items() if addr != lost_leader)
        step_s = self.config.heartbeat_interval_ms / 1000
        delay_s = survivors.index(self.config.self_id) * step_s + random.uniform(0, step_s / 2)
        so = self.so
        so._SyncObj__raftElectionDeadline = min(so._SyncObj__raftElectionDeadline, time.monotonic() + delay_s)
        return delay_s

    def hold_ack(self, node, message: dict) -> None:
        """A follower wants to tell the leader it holds entries up to next_node_idx - 1."""
        self._held_acks.append((node, message))

    def _throttle_snapshot_chunks(self) -> None:
        """Flow control for snapshot transfers: while a follower's connection still holds more than
        replication_unsent_bytes_max unsent, pysyncobj gets no next chunk (None ends its send loop for
        that node this tick) instead of copying the whole file into the send buffer."""
        serializer = self.so._SyncObj__serializer
        next_chunk = serializer.getTransmissionData
        transport = self.so._SyncObj__transport
        limit = self.config.replication_unsent_bytes_max

        def throttled(node):
            if transport.unsent_bytes(node) > limit:
                return None
            return next_chunk(node)

        serializer.getTransmissionData = throttled

    def hold_back(self, node, message: dict) -> bool:
        """Flow control: while a follower still has more than replication_unsent_bytes_max of our data
        waiting in its connection's send buffer, send it no more entries. pysyncobj would queue every
        new entry (and copy the growing buffer on each append), and heartbeats would wait behind it."""
        transport = self.so._SyncObj__transport
        if transport.unsent_bytes(node) <= self.config.replication_unsent_bytes_max:
            return False
        so = self.so
        so._SyncObj__raftNextIndex[node] = message["entries"][0][1]  # resend from here later
        so._SyncObj__connectedNodes.discard(node)  # ends pysyncobj's send loop for this node, this tick
        self._throttled.add(node)
        self.stats["sends_held_back"] += 1
        return True

    def _restore_throttled(self) -> None:
        if not self._throttled:
            return
        transport = self.so._SyncObj__transport
        connected = self.so._SyncObj__connectedNodes
        for node in self._throttled:
            if transport.is_connected(node):
                connected.add(node)
        self._throttled.clear()

    def release_acks(self) -> None:
        """Commit the store (fsync under SYNC_FLUSH if it holds new log entries), then send held acks."""
        if not self._held_acks:
            return
        held, self._held_acks = self._held_acks, []
        # Apply what the leader's messages just committed in the same transaction: one durable commit
        # per burst instead of one for the log and another for the apply.
        self.so._SyncObj__applyLogEntries()
        self._commit_store()
        latest: dict = {}
        for node, message in held:  # only the newest ack per leader matters
            latest[node] = message
        transport = self.so._SyncObj__transport
        for node, message in latest.items():
            self.stats["acks_sent"] += 1
            if self.journal.durable_index < message["next_node_idx"] - 1:
                self.stats["acks_beyond_durable"] += 1
            transport.send_now(node, message)

    def _commit_store(self) -> None:
        """Commit the open transaction. Under SYNC_FLUSH the commit is LMDB's synchronous one (durable
        and ordered); under ASYNC_FLUSH it is not, and the flusher thread fsyncs on its interval."""
        if not self.store.has_pending_writes:
            return
        self.store.commit()
        journal = self.journal
        self._committed_last_index = journal.last_index
        if self.store.sync_commits:
            journal.durable_index = journal.last_index

    def _flush_loop(self) -> None:
        """ASYNC_FLUSH: fsync what the tick thread committed, every async_flush_interval_ms."""
        interval_s = self.config.async_flush_interval_ms / 1000
        while not self._stop.wait(interval_s):
            committed = self._committed_last_index
            if committed <= self.journal.durable_index:
                continue
            try:
                self.store.sync()
            except Exception as exc:  # noqa: BLE001 - the tick thread stops the replica
                self.fail(exc)
                return
            self._async_durable_index = committed  # folded in by the tick thread (_on_tick_end)

    def _send_new_entries(self) -> None:
        """Leader: one append_entries per follower for everything added or committed this tick."""
        so = self.so
        if so._SyncObj__raftState != RaftState.LEADER:
            self._sent_last_index = self._sent_commit_index = 0
            return
        last, commit = self.journal.last_index, so.raftCommitIndex
        now = time.monotonic()
        commit_news = commit > self._sent_commit_index and (
            now - self._sent_commit_at >= self.config.follower_commit_notify_ms / 1000)
        if last > self._sent_last_index or commit_news:
            so._SyncObj__sendAppendEntries()
            self._sent_last_index, self._sent_commit_index, self._sent_commit_at = last, commit, now

    def _on_tick_end(self) -> None:
        """Runs on the tick thread after pysyncobj's work and before it polls sockets."""
        so = self.so
        if self._async_durable_index > self.journal.durable_index:
            self.journal.durable_index = min(self._async_durable_index, self.journal.last_index)
        if so.raftLastApplied > self._recorded_applied:  # no-op entries advance it too
            self._record_applied(so.raftLastApplied, self.store.write_txn())
            self._recorded_applied = so.raftLastApplied
        if so._SyncObj__raftState == RaftState.LEADER:
            self.stats["commits_checked"] += 1
            if so.raftCommitIndex > self.journal.durable_index and so.raftCommitIndex > 1:
                self.stats["commits_beyond_durable"] += 1
        self._send_new_entries()  # before our own fsync: followers write while we do
        self._commit_store()
        deferred, self._deferred = self._deferred, []
        for callback, result, reason in deferred:
            callback(result, reason)
        self.view = self._make_view()
        self._after_tick(self.view)

    def defer(self, callback: Callable, result, reason: int) -> None:
        """Hold a pysyncobj callback until the transaction it depends on is committed (tick end)."""
        self._deferred.append((callback, result, reason))

    def _fail_deferred(self, exc: BaseException) -> None:
        deferred, self._deferred = self._deferred, []
        for callback, _result, _reason in deferred:
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)
        self._on_failure(exc)

    def _make_view(self) -> EngineView:
        so = self.so
        state = so._SyncObj__raftState
        noop = so._SyncObj__noopIDx
        leader_ready = state == RaftState.LEADER and noop is not None and so.raftLastApplied >= noop
        leader = so._getLeader()
        match = dict(so._SyncObj__raftMatchIndex) if state == RaftState.LEADER else {}
        return EngineView(
            raft_state=state,
            leader_ready=leader_ready,
            term=so.raftCurrentTerm,
            leader_address=leader.address if leader is not None else None,
            commit_index=so.raftCommitIndex,
            applied_index=so.raftLastApplied,
            first_index=self.journal.first_index,
            last_index=self.journal.last_index,
            durable_index=self.journal.durable_index,
            match_index={n.address: i for n, i in match.items()},
            connected_peers=tuple(sorted(n.address for n in so.otherNodes if so.isNodeConnected(n))),
        )

    def peer_id(self, address: str | None) -> str | None:
        return self._address_to_id.get(address) if address else None

    # -- log compaction / snapshots --------------------------------------------------------------------------
    def force_compaction(self) -> None:
        self.so.forceLogCompaction()

