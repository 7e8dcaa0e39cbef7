"""The pysyncobj seam: the only module that imports pysyncobj, and everything dledger changes in it.

Applied once, when this module is first imported (each change pinned by tests/dledger/test_raft_seam.py):
- Journal: `pysyncobj.syncobj.createJournal` is wrapped so a replica's SyncObj gets our LMDB journal
  (its FileJournal keeps every entry in a Python list and never fsyncs). The engine registers its
  journal under a token (register_journal) and passes that token as pysyncobj's journalFile.
- Wire format: messages are pickled with the highest protocol instead of 2 (protocol 2 turns every
  bytes payload into a latin-1 str: ~1.6x size and CPU) and not zlib-compressed (CPU on 2 cores).
  Connection buffers are bytearrays: pysyncobj's bytes `+=` copied the whole pending buffer on every
  socket read, which starved followers under load. A connection closed for an undecodable message or
  a read timeout says so in the log. Every pickle pysyncobj reads (messages, commands, snapshot metadata) goes
  through dledger.plainpickle: plain data, or refused before anything in it is called. A frame longer than
  allow_frames_up_to allows, a first message that is not an address, and a message whose shape
  dledger.peermessages refuses close that connection with a log line instead of stopping the replica.
- Encryption: with a password, frames are sealed with AES-256-GCM (`RaftSealer`) instead of pysyncobj's
  Fernet (AES-CBC + HMAC-SHA256 + base64), which cost about 40 % of publish throughput on 2 cores.
- Outgoing peer sockets bind to the replica's own address (bind_outgoing_sockets, per thread), so a
  peer is one IP on the wire and a firewall rule can cut exactly one replica off (tests use 127.0.0.11-13).

And what the engine plugs into a SyncObj:
- EngineSyncObj: a SyncObj whose one replicated method hands each committed batch to the engine, and whose
  apply loop and send to followers go through the engine (entries that fail their check are held back).
- Transport: pysyncobj's TCP transport with the engine's hooks (acks held until the store is committed,
  flow control, pre-vote messages, append_entries rewriting, refusal of entries that fail their check and of
  forwarded appends (the admission check; NOT_LEADER while leadership is being handed over), repair messages,
  fast failover on a lost leader connection, a log line for every request_vote and timeout_now it handled: what
  it decided and on what, which pysyncobj never says); it refuses pysyncobj's
  unauthenticated utility commands.
- BudgetedQueue: pysyncobj's command queue with a byte budget per tick.
- check_internals: the engine refuses to start if the pysyncobj internals it relies on are missing.
"""

from __future__ import annotations

import collections
import errno
import logging
import pickle
import queue
import socket as _socket
import struct
import threading
from collections.abc import Callable

import pysyncobj.pickle as _pso_pickle
import pysyncobj.syncobj as _pso_syncobj
import pysyncobj.tcp_connection as _pso_tcp
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import SyncObjException
from pysyncobj.transport import TCPTransport

from . import peermessages, plainpickle
from .errors import ListenError
from .journal import LmdbJournal
from .repair import FETCH, FETCH_RESP
from .sealer import RaftSealer

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION_RANGE = ("0.3.17", "0.4")
# The `error` of an apply_command_response by which a leader refuses a forwarded append: (REFUSED, code, text).
# pysyncobj hands any `error` to the follower's callback as its fail reason; Replica turns this one into
# AppendRefusedError.
REFUSED = "dl_refused"
REGULAR_COMMAND_TYPE = 0  # pysyncobj's _COMMAND_TYPE.REGULAR (logformat.REGULAR_COMMAND once stored)

__all__ = ["FAIL_REASON", "PYSYNCOBJ_VERSION_RANGE", "REFUSED", "REGULAR_COMMAND_TYPE", "BudgetedQueue",
           "EngineSyncObj", "PipeNotifier", "RaftSealer", "RaftState", "SyncObjConf", "Transport",
           "bind_outgoing_sockets", "check_internals", "register_journal"]


class RaftState:
    """pysyncobj's _RAFT_STATE values."""

    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


# -- the journal --------------------------------------------------------------------------------------
_pending_journals: dict[str, LmdbJournal] = {}
_pending_lock = threading.Lock()
_original_create_journal = _pso_syncobj.createJournal


def now() -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW on Linux), which its election deadlines and response times use.
    time.monotonic() is CLOCK_MONOTONIC: the two drift apart by the host's NTP corrections (0.25 s after 11.5 h
    on the development machine), so a deadline set with one and compared with the other fires early or late."""
    return _pso_tcp.monotonicTime()


def _create_journal(journal_file=None):
    with _pending_lock:
        journal = _pending_journals.pop(journal_file, None) if journal_file else None
    return journal if journal is not None else _original_create_journal(journal_file)


def register_journal(token: str, journal: LmdbJournal) -> None:
    """The next SyncObj built with journalFile=token gets `journal` (taken once)."""
    with _pending_lock:
        _pending_journals[token] = journal


_pso_syncobj.createJournal = _create_journal

# -- wire format ----------------------------------------------------------------------------------------
_pso_pickle.__dict__["__protocol"] = pickle.HIGHEST_PROTOCOL
# every pickle pysyncobj reads (messages, commands at apply, snapshot metadata) is plain data or refused
_pso_pickle.loads = plainpickle.loads
_pso_pickle.load = plainpickle.load


# -- source-bound outgoing sockets ------------------------------------------------------------------------
_thread_source = threading.local()


def bind_outgoing_sockets(ip: str | None) -> None:
    """Peer sockets pysyncobj creates on the calling thread from now on bind to `ip` (None: no binding)."""
    _thread_source.ip = ip


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


# -- linear-time connection buffers -----------------------------------------------------------------------
# pysyncobj keeps each connection's read and write buffers as bytes and grows them with `+=` and shrinks
# them with slicing: every socket read copies the whole pending buffer, so a 4 MiB message arriving in
# 64 KiB reads costs ~128 MiB of copying, and followers starved the CPU under load. Same wire format,
# bytearray buffers (append and front-deletion are amortised O(1) in CPython).
_Conn = _pso_tcp.TcpConnection
_FRAME = struct.Struct("i")  # pysyncobj's length prefix: native int


_pso_syncobj.getEncryptor = RaftSealer  # SyncObj builds its encryptor from conf.password with this name


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


_recv_scratch = threading.local()  # each tick thread's receive buffer (every connection is read on its engine's)


def _scratch(size: int) -> memoryview:
    view = getattr(_recv_scratch, "view", None)
    if view is None or len(view) < size:
        view = _recv_scratch.view = memoryview(bytearray(size))
    return view


def _conn_process_read(self):
    # recv_into a buffer kept per thread, not sock.recv(recvBufferSize): that allocates recvBufferSize (4 MiB) per
    # call and shrinks it, an mmap and munmap each time; it was 77 % of a follower's Raft thread at one send at a
    # time (py-spy), 13 us against 1.3 us per read alone (docs/architecture.md, "The pysyncobj seam").
    sock = self._TcpConnection__socket
    view = _scratch(self._TcpConnection__recvBufferSize)
    try:
        got = sock.recv_into(view)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if not got or sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR):
        self.disconnect()
        return False
    buf = self._TcpConnection__readBuffer
    if type(buf) is not bytearray:
        buf = self._TcpConnection__readBuffer = bytearray(buf)
    buf += view[:got]
    return True


def _conn_parse_message(self):
    buf = self._TcpConnection__readBuffer
    if len(buf) < 4:
        return None
    length = _FRAME.unpack_from(buf)[0]
    if not 0 <= length <= self.dl_frame_bytes_max:
        log.warning("closing a peer connection: a frame of %d bytes announced, over the %d-byte limit (set by "
                    "entry_bytes_max)", length, self.dl_frame_bytes_max)
        self.disconnect()
        return None
    if len(buf) - 4 < length:
        return None
    data = bytes(buf[4:4 + length])
    try:
        if self.encryptor:
            timestamp, plain = self.encryptor.open(data)  # verifies the tag, which covers the timestamp
            if timestamp < self.recvLastTimestamp:
                raise ValueError("replayed or reordered encrypted message")
            self.recvLastTimestamp = timestamp
            data = plain
        message = plainpickle.loads(data)
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


def _conn_check_timeout(self):
    idle_s = _pso_tcp.monotonicTime() - self._TcpConnection__lastReadTime
    if idle_s > self._TcpConnection__timeout:
        log.warning("closing a peer connection: nothing received for %.1f s", idle_s)
        self.disconnect()


for _name in ("_TcpConnection__processSend", "_TcpConnection__processRead", "_TcpConnection__processParseMessage",
              "_TcpConnection__processConnectionTimeout", "_TcpConnection__trySendBuffer"):
    if not hasattr(_Conn, _name):
        raise RuntimeError(f"pysyncobj.tcp_connection changed ({_name} missing); dledger needs 0.3.x")
_Conn.send = _conn_send
_Conn._TcpConnection__processConnectionTimeout = _conn_check_timeout
_Conn._TcpConnection__processSend = _conn_process_send
_Conn._TcpConnection__processRead = _conn_process_read
_Conn._TcpConnection__processParseMessage = _conn_parse_message
_Conn.dl_frame_bytes_max = 0  # raised by each engine of this process before it connects (allow_frames_up_to)


def allow_frames_up_to(frame_bytes: int) -> None:
    """Raft connections of this process accept frames up to frame_bytes (the largest any engine here needs; never
    lowered). A larger announced length closes the connection before anything is buffered: a peer cannot make
    a replica hold gigabytes for one message."""
    _Conn.dl_frame_bytes_max = max(_Conn.dl_frame_bytes_max, frame_bytes)


# -- what the engine plugs into a SyncObj ----------------------------------------------------------------
class Transport(TCPTransport):
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
            if kind in ("append_entries", "next_node_idx"):
                engine.stamp_clock(message)
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
        # The first message of a connection a peer opened: with a password its session key (bytes), then its
        # address. pysyncobj also accepts unauthenticated utility commands (leadership transfer, membership,
        # status) and read-only nodes that receive the whole log; a replica group has neither.
        if self._syncObj.encryptor and not conn.sendRandKey:
            refusal = None if isinstance(message, bytes) else f"a session key is bytes, not a {type(message).__name__}"
        elif isinstance(message, list) or message == "readonly":
            refusal = "a pysyncobj utility or read-only connection"
        else:
            refusal = None if isinstance(message, str) else f"a peer names itself by its address, not a " \
                                                            f"{type(message).__name__}"
        if refusal is None and isinstance(message, str) and message not in self._nodeAddrToNode:
            # a replica that is not a member (removed, or not added yet): tell it why before closing
            conn.send(self._syncObj.dl_engine.not_member_notice())
            refusal = f"{message[:100]} is not a member of the group"
        if refusal:
            log.warning("refused a connection on the Raft port: %s", refusal)
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)

    def send_now(self, node, message):
        return super().send(node, message)

    def dropNode(self, node):  # noqa: N802 (pysyncobj's name)
        # a membership change removed this peer: tell it before the connection closes (its own log may never
        # hear of the removal: the leader stops sending to it the moment the change is in its log)
        # (closing the transport drops every node too: those are still members)
        conn = self._connections.get(node)
        removed = node not in self._syncObj._SyncObj__otherNodes
        if removed and conn is not None and conn.state == _pso_tcp.CONNECTION_STATE.CONNECTED:
            conn.send(self._syncObj.dl_engine.not_member_notice())
        super().dropNode(node)

    def _onMessageReceived(self, node, message):  # noqa: N802
        refusal = peermessages.problem(message)
        if refusal:
            log.warning("closing the connection of %s: a malformed Raft message (%s)", node.address, refusal)
            conn = self._connections.get(node)
            if conn is not None:
                conn.disconnect()
            return
        engine = self._syncObj.dl_engine
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "dl_hello":
            engine.on_hello(node, message)
            return
        if kind == "dl_not_member":
            engine.on_not_member(node, message)
            return
        if not engine.accepts(node):
            return  # no accepted hello on this connection (another group or history), or no history yet
        if kind == "request_vote":
            if not engine.grants_vote((message["last_log_term"], message["last_log_index"])):
                return  # a non-voter gives no vote (and takes no term from a candidate); see engine.grants_vote
            before = engine.vote_state()
            super()._onMessageReceived(node, message)
            engine.after_vote_request(node, message, before)
            return
        if kind == "timeout_now":
            super()._onMessageReceived(node, message)
            engine.log_timeout_now(node, message)
            return
        if kind in ("dl_prevote", "dl_prevote_resp"):
            engine.on_prevote_message(node, message)
            return
        if kind == "dl_snapshot_progress":
            return  # only there so the leader's connection sees traffic during a long transfer
        if kind == "dl_stale_term":
            engine.on_stale_term(node, message)
            return
        if kind == "append_entries" and engine.refuses_stale_leader(node, message):
            return  # pysyncobj would drop it silently: the leader is told our term instead
        if kind in (FETCH, FETCH_RESP):
            engine.on_repair_message(node, message)
            return
        if kind == "apply_command" and self._syncObj._isLeader() and engine.transfer_target is not None:
            # handing leadership over: the follower's append fails as not-leader and is retried on the new leader
            if "request_id" in message:
                super().send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                    "error": FAIL_REASON.NOT_LEADER})
            return
        if kind == "apply_command" and self._syncObj._isLeader():
            refusal = engine.refusal_of_forwarded(message.get("command"))
            if refusal is not None:
                if "request_id" in message:
                    super().send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                        "error": (REFUSED, *refusal)})
                return
            engine.note_forwarded()
        if kind == "response_vote":
            if not engine.counts_vote_of(node):
                return  # a vote from outside this candidate's voters (a learner) is not counted, by pysyncobj either
            super()._onMessageReceived(node, message)
            engine.maybe_win_election()  # a majority of the voters, learners aside (pysyncobj counts every member)
            return
        if kind in ("append_entries", "next_node_idx"):
            engine.on_clock_stamp(node, message)
        if kind == "append_entries":
            engine.on_leader_contact(node, message["term"])
            engine.note_leader_commit(message["commit_index"])
            message = engine.trim_known_entries(message)
            message = engine.refuse_corrupt_entries(node, message)
            if message.get("serialized"):
                # pysyncobj acknowledges only the last chunk of a snapshot; without traffic the leader's
                # side would close the connection (connectionTimeout) during a long transfer.
                super().send(node, {"type": "dl_snapshot_progress"})
        super()._onMessageReceived(node, message)

    def _onNodeDisconnected(self, node):  # noqa: N802
        self._syncObj.dl_engine.on_peer_hello_lost(node)
        super()._onNodeDisconnected(node)
        self._syncObj.dl_engine.on_peer_disconnected(node)

    def _onNodeConnected(self, node):  # noqa: N802
        # The hello goes first on every connection: a peer takes nothing else from us before it. Straight onto
        # the connection: an outgoing one is still CONNECTING here, and send() would drop it.
        conn = self._connections.get(node)
        if conn is not None:
            conn.send(self._syncObj.dl_engine.hello())
        super()._onNodeConnected(node)
        self._syncObj.dl_engine.on_peer_connected(node)


class BudgetedQueue:
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

    def __len__(self) -> int:
        return len(self._queue)


class EngineSyncObj(SyncObj):
    """A SyncObj driven by a dledger engine: its one replicated method hands each batch to the engine."""

    def __init__(self, engine, self_addr: str, other_addrs: list[str], conf: SyncObjConf):
        """Binds the Raft listener before it returns (pysyncobj does, without its auto-tick thread): raises
        ListenError once conf.maxBindRetries tries, conf.bindRetryTime apart, failed (with maxBindRetries=0
        pysyncobj would spin on the CPU forever, silently)."""
        self.dl_engine = engine
        try:
            super().__init__(self_addr, other_addrs, conf=conf, transportClass=Transport)
        except SyncObjException as exc:
            if exc.errorCode != "BindError":
                raise
            c = engine.config
            raise ListenError(
                f"replica {c.group_id}/{c.self_id} cannot listen for its Raft peers on {self_addr} (tried for "
                f"{conf.maxBindRetries * conf.bindRetryTime:.1f} s): the port is in use or the address is not this "
                "host's; free it, or give this replica another address in the peer list of every replica") from None

    @replicated
    def dl_apply(self, blob):
        return self.dl_engine.apply_blob(blob)

    # pysyncobj calls these as self.__name(): an override here is what its tick runs. The engine keeps both from
    # reading an entry of our store that failed its check (apply waits for the repair; followers that need it
    # are served up to it).
    def _SyncObj__applyLogEntries(self):  # noqa: N802
        return self.dl_engine.apply_entries(lambda: SyncObj._SyncObj__applyLogEntries(self))

    def _SyncObj__sendAppendEntries(self):  # noqa: N802
        self.dl_engine.send_append_entries(lambda: SyncObj._SyncObj__sendAppendEntries(self))

    def apply_method_id(self) -> int:
        """The id pysyncobj gives dl_apply in every data command (logformat.encode_call)."""
        return self._methodToID[self._getFuncName("dl_apply")]


# every pysyncobj private name dledger reads or writes (a test checks the list is whole)
_INTERNALS = ("_SyncObj__raftLastApplied", "_SyncObj__needLoadDumpFile", "_SyncObj__raftElectionDeadline",
              "_SyncObj__raftState", "_SyncObj__noopIDx", "_SyncObj__raftLog", "_SyncObj__raftMatchIndex",
              "_SyncObj__commandsQueue", "_SyncObj__raftNextIndex", "_SyncObj__connectedNodes",
              "_SyncObj__transport", "_SyncObj__sendAppendEntries", "_SyncObj__serializer",
              "_SyncObj__votedForNodeId", "_SyncObj__applyLogEntries", "_SyncObj__transferInProgress",
              "_SyncObj__setState", "_SyncObj__votesCount", "_SyncObj__onBecomeLeader", "_SyncObj__lastResponseTime",
              "_SyncObj__raftLeader", "_SyncObj__raftCommitIndex", "_SyncObj__leaderCommitIndex", "_SyncObj__conf",
              "_SyncObj__otherNodes", "_SyncObj__setCurrentTerm", "_SyncObj__doChangeCluster")
_OVERRIDDEN = ("_SyncObj__applyLogEntries", "_SyncObj__sendAppendEntries")  # by EngineSyncObj


def check_internals(so: SyncObj, journal: LmdbJournal) -> None:
    """Fail loudly if this pysyncobj does not have the internals the engine relies on."""
    for name in _INTERNALS:
        if not hasattr(SyncObj, name) and not hasattr(so, name):
            raise RuntimeError(f"pysyncobj internals changed ({name} missing); dledger supports "
                               f"pysyncobj {PYSYNCOBJ_VERSION_RANGE[0]} up to {PYSYNCOBJ_VERSION_RANGE[1]}")
    for name in _OVERRIDDEN:
        if not callable(getattr(SyncObj, name, None)):
            raise RuntimeError(f"pysyncobj internals changed ({name} missing); EngineSyncObj overrides it")
    if so._SyncObj__raftLog is not journal:
        raise RuntimeError("pysyncobj did not take the LMDB journal (createJournal seam failed)")
