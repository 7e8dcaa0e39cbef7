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
- RaftCore: the one adapter the engine reads and drives a SyncObj through; every private name of pysyncobj dledger
  uses is spelled in it (or, for the connection patches, in CONNECTION_INTERNALS), and check_internals checks them.
- check_internals: the engine refuses to start if the pysyncobj internals it relies on are missing.
"""

from __future__ import annotations

import errno
import logging
import operator
import pickle
import socket as _socket
import struct
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import pysyncobj.pickle as _pso_pickle
import pysyncobj.syncobj as _pso_syncobj
import pysyncobj.tcp_connection as _pso_tcp
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import SyncObjException
from pysyncobj.transport import TCPTransport

from . import logformat, peermessages, plainpickle
from .errors import ListenError
from .journal import LmdbJournal
from .repair import FETCH, FETCH_RESP
from .sealer import RaftSealer

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION_RANGE = ("0.3.17", "0.4")  # >= the first, < the second; pyproject.toml's pin must say the same
# The `error` of an apply_command_response by which a leader refuses a forwarded append: (REFUSED, code, text).
# pysyncobj hands any `error` to the follower's callback as its fail reason; Replica turns this one into
# AppendRefusedError.
REFUSED = "dl_refused"
# The first byte of a stored command is pysyncobj's command type; logformat, the public layout, names the bytes
# (REGULAR_COMMAND, NO_OP_COMMAND) and this pysyncobj must agree, checked here at import.
REGULAR_COMMAND_TYPE = logformat.REGULAR_COMMAND[0]
if (_pso_syncobj._COMMAND_TYPE.REGULAR, _pso_syncobj._COMMAND_TYPE.NO_OP) != (REGULAR_COMMAND_TYPE,
                                                                          logformat.NO_OP_COMMAND[0]):
    raise RuntimeError("pysyncobj's command types changed (_COMMAND_TYPE): the stored layout (dledger/logformat.py) "
                       f"would no longer match; dledger supports pysyncobj {PYSYNCOBJ_VERSION_RANGE[0]} up to "
                       f"{PYSYNCOBJ_VERSION_RANGE[1]}")

__all__ = ["FAIL_REASON", "PRIVATE_NAMES", "PYSYNCOBJ_VERSION_RANGE", "REFUSED", "REGULAR_COMMAND_TYPE",
           "EngineSyncObj", "PipeNotifier", "RaftCore", "RaftSealer", "RaftState", "SyncObjConf",
           "Transport", "bind_outgoing_sockets", "check_internals", "register_journal"]


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


# every private name of pysyncobj's TcpConnection the patches above read or replace: its methods, and the attributes
# its __init__ sets (their mangled names are in its code's names)
CONNECTION_INTERNALS = ("_TcpConnection__processSend", "_TcpConnection__processRead",
                        "_TcpConnection__processParseMessage", "_TcpConnection__processConnectionTimeout",
                        "_TcpConnection__trySendBuffer", "_TcpConnection__processConnection",
                        "_TcpConnection__writeBuffer", "_TcpConnection__readBuffer", "_TcpConnection__socket",
                        "_TcpConnection__recvBufferSize", "_TcpConnection__lastReadTime", "_TcpConnection__timeout")
for _name in CONNECTION_INTERNALS:
    if not hasattr(_Conn, _name) and _name not in _Conn.__init__.__code__.co_names:
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
    """pysyncobj's TCP transport plus the hooks dledger needs (flush-before-ack, pre-vote, fast failover).

    It routes each message to the part of the engine that owns its job (engine.py lists them)."""

    def send(self, node, message):
        engine = self._syncObj.dl_engine
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "next_node_idx" and message.get("success"):
                engine.durability.hold_ack(node, message)  # sent after the store is committed (release_acks)
                return True
            if kind == "append_entries" and message.get("entries") and engine.replication.hold_back(node, message):
                self.drain(node)
                return True
            if kind in ("append_entries", "next_node_idx"):
                engine.clock_link.stamp(message)
        engine.durability.release_acks()  # keep held acks ahead of anything sent after them
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
            conn.send(self._syncObj.dl_engine.roster.not_member_notice())
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
        removed = not self._syncObj.dl_core.replicates_to(node)
        if removed and conn is not None and conn.state == _pso_tcp.CONNECTION_STATE.CONNECTED:
            conn.send(self._syncObj.dl_engine.roster.not_member_notice())
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
            engine.hellos.on_hello(node, message)
            return
        if kind == "dl_not_member":
            engine.on_not_member(node, message)
            return
        if not engine.hellos.accepts(node):
            return  # no accepted hello on this connection (another group or history), or no history yet
        if kind == "request_vote":
            if not engine.hellos.grants_vote((message["last_log_term"], message["last_log_index"])):
                return  # a non-voter gives no vote (and takes no term from a candidate); see Hellos.grants_vote
            before = engine.elections.vote_state()
            super()._onMessageReceived(node, message)
            engine.elections.after_vote_request(node, message, before)
            return
        if kind == "timeout_now":
            super()._onMessageReceived(node, message)
            engine.elections.log_timeout_now(node, message)
            return
        if kind in ("dl_prevote", "dl_prevote_resp"):
            engine.elections.on_prevote_message(node, message)
            return
        if kind == "dl_snapshot_progress":
            return  # only there so the leader's connection sees traffic during a long transfer
        if kind == "dl_stale_term":
            engine.elections.on_stale_term(node, message)
            return
        if kind == "append_entries" and engine.elections.refuses_stale_leader(node, message):
            return  # pysyncobj would drop it silently: the leader is told our term instead
        if kind in (FETCH, FETCH_RESP):
            engine.repairs.on_message(node, message)
            return
        if kind == "apply_command" and self._syncObj._isLeader() and engine.handover.target is not None:
            # handing leadership over: the follower's append fails as not-leader and is retried on the new leader
            if "request_id" in message:
                super().send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                    "error": FAIL_REASON.NOT_LEADER})
            return
        if kind == "apply_command" and self._syncObj._isLeader():
            refusal = engine.replication.refusal_of_forwarded(message.get("command"))
            if refusal is not None:
                if "request_id" in message:
                    super().send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                        "error": (REFUSED, *refusal)})
                return
            engine.replication.note_forwarded()
        if kind == "response_vote":
            if not engine.roster.counts_vote_of(node):
                return  # a vote from outside this candidate's voters (a learner) is not counted, by pysyncobj either
            super()._onMessageReceived(node, message)
            # a majority of the voters, learners aside (pysyncobj counts every member)
            engine.elections.maybe_win_election()
            return
        if kind in ("append_entries", "next_node_idx"):
            engine.clock_link.on_stamp(node, message)
        if kind == "append_entries":
            engine.on_leader_contact(node, message["term"])
            engine.hellos.note_leader_commit(message["commit_index"])
            message = engine.replication.trim_known_entries(message)
            message = engine.replication.refuse_corrupt_entries(node, message)
            if message.get("serialized"):
                # pysyncobj acknowledges only the last chunk of a snapshot; without traffic the leader's
                # side would close the connection (connectionTimeout) during a long transfer.
                super().send(node, {"type": "dl_snapshot_progress"})
        super()._onMessageReceived(node, message)

    def _onNodeDisconnected(self, node):  # noqa: N802
        self._syncObj.dl_engine.hellos.on_peer_hello_lost(node)
        super()._onNodeDisconnected(node)
        self._syncObj.dl_engine.elections.on_peer_disconnected(node)

    def _onNodeConnected(self, node):  # noqa: N802
        # The hello goes first on every connection: a peer takes nothing else from us before it. Straight onto
        # the connection: an outgoing one is still CONNECTING here, and send() would drop it.
        conn = self._connections.get(node)
        if conn is not None:
            conn.send(self._syncObj.dl_engine.hellos.hello())
        super()._onNodeConnected(node)
        self._syncObj.dl_engine.elections.on_peer_connected(node)


class EngineSyncObj(SyncObj):
    """A SyncObj driven by a dledger engine: its one replicated method hands each batch to the engine."""

    def __init__(self, engine, core: RaftCore, self_addr: str, other_addrs: list[str], conf: SyncObjConf):
        """Binds the Raft listener before it returns (pysyncobj does, without its auto-tick thread): raises
        ListenError once conf.maxBindRetries tries, conf.bindRetryTime apart, failed (with maxBindRetries=0
        pysyncobj would spin on the CPU forever, silently). `core` is attached to this SyncObj first."""
        self.dl_engine = engine
        self.dl_core = core
        core.attach(self)
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


# -- the one adapter: every private name of pysyncobj's SyncObj dledger reads, writes or calls ---------------
T = TypeVar("T")


class _Private(property, Generic[T]):
    """A private attribute of pysyncobj's SyncObj, by its mangled name, read and written through RaftCore. A property
    whose getter is operator.attrgetter (C): the Raft thread reads these on every tick, and a descriptor written in
    Python cost the dledger-alone append p50 about 0.1 ms (bench/README.md, "The house restructured")."""

    def __init__(self, name: str, writable: bool = True):
        def refuse(core, value) -> None:
            raise AttributeError(f"dledger never writes pysyncobj's {name}")

        def write(core, value) -> None:
            setattr(core.so, name, value)

        super().__init__(operator.attrgetter(f"so.{name}"), write if writable else refuse)
        self.name = name
        self.writable = writable


class _PrivateMethod(property):
    """A private method of pysyncobj's SyncObj, by its mangled name (called on the SyncObj: an override in
    EngineSyncObj is what runs)."""

    def __init__(self, name: str, overridden: bool = False):
        super().__init__(operator.attrgetter(f"so.{name}"))
        self.name = name
        self.overridden = overridden


class RaftCore:
    """A replica's SyncObj as the engine sees it: typed names for every pysyncobj internal it uses, public or
    private. The private ones are spelled only here (SYNCOBJ_INTERNALS lists them, and check_internals checks
    each one when a replica opens): a renamed internal stops the replica at open, never makes a write create a
    new attribute silently. Built before the SyncObj (the engine's parts take it), attached by EngineSyncObj."""

    state = _Private[int]("_SyncObj__raftState", writable=False)  # RaftState; changed with set_state
    leader = _Private[object]("_SyncObj__raftLeader")  # the node it follows; set to None when it steps down
    commit_index = _Private[int]("_SyncObj__raftCommitIndex")
    leader_commit_index = _Private[int]("_SyncObj__leaderCommitIndex")
    last_applied = _Private[int]("_SyncObj__raftLastApplied")
    noop_index = _Private["int | None"]("_SyncObj__noopIDx", writable=False)  # its term's first entry, as leader
    voted_for = _Private[object]("_SyncObj__votedForNodeId", writable=False)
    votes_count = _Private[int]("_SyncObj__votesCount", writable=False)
    election_deadline = _Private[float]("_SyncObj__raftElectionDeadline")  # on now()'s clock
    transfer_in_progress = _Private[bool]("_SyncObj__transferInProgress")  # a timeout_now was taken
    match_index = _Private[dict]("_SyncObj__raftMatchIndex", writable=False)  # node -> index (leader)
    next_index = _Private[dict]("_SyncObj__raftNextIndex", writable=False)  # node -> index (leader)
    connected_nodes = _Private[set]("_SyncObj__connectedNodes", writable=False)  # the nodes its send loop serves
    last_response_time = _Private[dict]("_SyncObj__lastResponseTime", writable=False)  # node -> now() (leader)
    _member_nodes = _Private[set]("_SyncObj__otherNodes", writable=False)  # otherNodes returns a copy of it
    transport = _Private["Transport"]("_SyncObj__transport", writable=False)
    serializer = _Private[object]("_SyncObj__serializer", writable=False)
    journal = _Private[LmdbJournal]("_SyncObj__raftLog", writable=False)
    private_conf = _Private[SyncObjConf]("_SyncObj__conf", writable=False)
    commands_queue = _Private[object]("_SyncObj__commandsQueue")
    need_load_dump_file = _Private[bool]("_SyncObj__needLoadDumpFile")

    set_state = _PrivateMethod("_SyncObj__setState")  # (RaftState)
    become_leader = _PrivateMethod("_SyncObj__onBecomeLeader")
    set_current_term = _PrivateMethod("_SyncObj__setCurrentTerm")  # (term, voted for)
    change_cluster = _PrivateMethod("_SyncObj__doChangeCluster")  # (["add" | "rem", address]) -> bool
    apply_log_entries = _PrivateMethod("_SyncObj__applyLogEntries", overridden=True)
    send_append_entries = _PrivateMethod("_SyncObj__sendAppendEntries", overridden=True)

    def __init__(self) -> None:
        self.so: EngineSyncObj | None = None

    def attach(self, so: EngineSyncObj) -> None:
        self.so = so

    @property
    def attached(self) -> bool:
        return self.so is not None

    # -- derived --------------------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        return self.state == RaftState.LEADER

    @property
    def leader_ready(self) -> bool:
        """Leader whose first entry of its term (pysyncobj's no-op) is applied."""
        noop = self.noop_index
        return self.state == RaftState.LEADER and noop is not None and self.last_applied >= noop

    def replicates_to(self, node) -> bool:
        return node in self._member_nodes

    # -- pysyncobj's public (or single-underscore) surface, under the engine's names -----------------------
    @property
    def term(self) -> int:
        return self.so.raftCurrentTerm

    @property
    def other_nodes(self) -> set:
        return self.so.otherNodes

    def leader_node(self):
        return self.so._getLeader()

    def is_connected(self, node) -> bool:
        return self.so.isNodeConnected(node)

    def apply_command(self, command: bytes, callback: Callable, command_type: int) -> None:
        self.so._applyCommand(command, callback, command_type)

    @property
    def poller(self):
        return self.so._poller

    def do_tick(self, wait_s: float) -> None:
        self.so.doTick(wait_s)

    def add_on_tick_callback(self, callback: Callable[[], None]) -> None:
        self.so.addOnTickCallback(callback)

    def force_log_compaction(self) -> None:
        self.so.forceLogCompaction()

    def destroy(self) -> None:
        self.so._doDestroy()

    def apply_method_id(self) -> int:
        return self.so.apply_method_id()


SYNCOBJ_INTERNALS = tuple(d for d in vars(RaftCore).values() if isinstance(d, (_Private, _PrivateMethod)))
# every pysyncobj private name the seam spells (tests/dledger/test_module_graph.py checks the source against it)
PRIVATE_NAMES = tuple(d.name for d in SYNCOBJ_INTERNALS) + CONNECTION_INTERNALS


def check_internals(core: RaftCore, journal: LmdbJournal) -> None:
    """Fail loudly if this pysyncobj does not have the internals the engine relies on (SYNCOBJ_INTERNALS; the
    connection's, CONNECTION_INTERNALS, were checked when this module was imported)."""
    so = core.so
    for internal in SYNCOBJ_INTERNALS:
        if not hasattr(SyncObj, internal.name) and not hasattr(so, internal.name):
            raise RuntimeError(f"pysyncobj internals changed ({internal.name} missing); dledger supports "
                               f"pysyncobj {PYSYNCOBJ_VERSION_RANGE[0]} up to {PYSYNCOBJ_VERSION_RANGE[1]}")
        if getattr(internal, "overridden", False) and not callable(getattr(SyncObj, internal.name, None)):
            raise RuntimeError(f"pysyncobj internals changed ({internal.name} missing); EngineSyncObj overrides it")
    if core.journal is not journal:
        raise RuntimeError("pysyncobj did not take the LMDB journal (createJournal seam failed)")
