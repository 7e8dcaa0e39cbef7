"""One broker replica's core: the dledger replica with the broker's state machine, the group-commit batcher,
the write guards, and the events the rest of the broker waits on (roles, topics). The jobs (topics.py,
writes.py, consume.py, queries.py) use it; service.py converts gRPC to their calls.

Writes become Commands committed through Raft (`commit`, `submit`); a replica that is not the leader forwards
them (dledger does). Reads (`read`) come from this replica's committed, applied tables only, so they never go
past its applied index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import dledger
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import (
    BadRequestError,
    NotMasterError,
    OutcomeUnknownError,
    PreconditionFailedError,
    RequestTimeoutError,
    StoreUnavailableError,
    TransferMissedError,
)

from .batcher import Batcher
from .config import BrokerConfig
from .errors import StoreFacts, from_dledger
from .guards import WriteGuards
from .statemachine import BrokerStateMachine

log = logging.getLogger(__name__)

GROUP_TIME_WAIT_S = 1.0  # how long a request waits for a group time (a new leader hears its followers within ms)
GROUP_TIME_POLL_S = 0.01


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.sm = BrokerStateMachine()
        self.replica: dledger.Replica | None = None
        self.sm.add_floor_listener(self._retention_floor_committed)
        self.replica = dledger.Replica.open(config.replica_config(), self.sm)
        self.replica.set_retention_floor(self.sm.retention_floor)  # the floor is kept in the tables, not by dledger
        self.store = self.replica.store
        self.guards = WriteGuards(self.store, config.data_dir, config.advertised, config.diskMaxUsedSpaceRatio,
                                  config.storeMapMaxUsedRatio, config.diskCheckIntervalMs)
        self.batcher = Batcher(self.replica, config, StoreFacts(config.storeMapSizeBytes, self.store.path,
                                                                self.guards.disk.used_percent))
        self.replica.set_append_admission(self.guards.admit_forwarded)
        # topic -> (the event its next commit sets, how many requests wait on it); an entry lives only while
        # someone waits, so waits on topics that never come (unknown names) leave nothing behind
        self._topic_events: dict[str, tuple[asyncio.Event, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._role_listeners: list[Callable[[], None]] = []
        self._topic_listeners: list[Callable[[], None]] = []
        # the client (gRPC) address of every replica of this group, as the NameServers know them; set by the
        # server. Only a refused write (slaveForwardEnable=false) asks it, to name the master's address.
        self.replica_addresses: Callable[[], Awaitable[dict[str, str]]] | None = None

    def _retention_floor_committed(self, floor: int) -> None:
        """Raft thread, after the commit of a retention command's apply: dledger may compact the log up to it."""
        if self.replica is not None:
            self.replica.set_retention_floor(floor)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Call from the event loop that serves requests."""
        self._loop = asyncio.get_running_loop()
        self.batcher.start()
        self.sm.add_listener(lambda topics, configs_changed: self._loop.call_soon_threadsafe(
            self._on_topics_committed, topics, configs_changed))
        self.replica.subscribe(lambda _status: self._loop.call_soon_threadsafe(self._fire, self._role_listeners))

    async def stop(self) -> None:
        await self.batcher.stop()
        await asyncio.to_thread(self.replica.close)

    # -- events -------------------------------------------------------------------------------------------
    def on_role_change(self, callback: Callable[[], None]) -> None:
        self._role_listeners.append(callback)

    def on_topic_change(self, callback: Callable[[], None]) -> None:
        self._topic_listeners.append(callback)

    @staticmethod
    def _fire(callbacks) -> None:
        for callback in callbacks:
            callback()

    def _on_topics_committed(self, topics: set[str], configs_changed: bool) -> None:
        for topic in topics:
            waiting = self._topic_events.pop(topic, None)
            if waiting is not None:
                waiting[0].set()
        if configs_changed:  # new messages alone must not re-register with every NameServer
            self._fire(self._topic_listeners)

    def topics_waited_on(self) -> int:
        """Topics some request is waiting on right now (bounded by the requests in flight)."""
        return len(self._topic_events)

    async def wait_for_topic(self, topic: str, timeout_s: float) -> None:
        """Wait until an entry touching `topic` is committed and applied here, or `timeout_s` passed."""
        event, waiters = self._topic_events.get(topic) or (asyncio.Event(), 0)
        self._topic_events[topic] = (event, waiters + 1)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            current = self._topic_events.get(topic)
            if current is not None and current[0] is event:  # not set meanwhile: one waiter fewer
                if current[1] <= 1:
                    del self._topic_events[topic]
                else:
                    self._topic_events[topic] = (event, current[1] - 1)

    # -- status ---------------------------------------------------------------------------------------------
    @property
    def status(self) -> dledger.ReplicaStatus:
        return self.replica.status()

    @property
    def is_master(self) -> bool:
        return self.replica.status().role is dledger.Role.LEADER

    # -- leadership transfer ----------------------------------------------------------------------------------
    async def transfer_leader(self, to: str = "", timeout_s: float | None = None) -> str:
        """Hand mastership of this group to replica `to` ("" = the most up-to-date one; a replica id, a brokerId,
        or a replica's client or Raft address) and wait until a new master is known; returns its replica id.
        Writes that arrive meanwhile are retried on the new master (batcher.py). Raises NotMasterError (this
        replica is not the master), RocketraftError PRECONDITION_FAILED (no fit target; nothing changed) or
        REQUEST_TIMEOUT (no new master in time), TransferMissedError (`to` was named, but another replica leads
        now: this one stepped down)."""
        target = await self._replica_id_of(to) if to else None
        try:
            return await asyncio.to_thread(self.replica.transfer_leadership, target, timeout_s)
        except dledger.TransferRefusedError as exc:
            raise PreconditionFailedError(f"leadership not transferred: {exc.message}") from None
        except dledger.TransferTimeoutError as exc:
            raise RequestTimeoutError(f"leadership transfer timed out: {exc.message}") from None
        except dledger.TransferMissedError as exc:
            raise TransferMissedError(
                f"master not moved to {exc.target}: {exc.leader_id} leads {self.config.brokerName} now, not "
                f"{exc.target} ({exc.target} may have stopped during the handover); run transferLeader --to "
                f"{exc.target} again to move it there", new_master=exc.leader_id) from None
        except dledger.NotLeaderError as exc:
            raise await self._not_master(exc.leader_id) from None

    # -- membership change (dledger.membership; docs/operations.md "Add, remove and replace a replica") -------------
    async def add_replica(self, spec: str, timeout_s: float | None = None) -> int:
        """Add the replica `spec` ("id-host:raftport") to this group; master only. Returns the Raft index of the
        committed change. Raises NotMasterError, RocketraftError BAD_REQUEST (a bad spec, already a member, the
        master itself), PRECONDITION_FAILED (another change is not committed yet) or PROXY_TIMEOUT (unknown)."""
        replica_id, _, address = spec.partition("-")
        if not replica_id or not address:
            raise BadRequestError(f"replica {spec!r}: give it as id-host:raftport, its dLegerSelfId and its "
                                  "dLegerPeers entry (e.g. n3-10.0.0.4:40911)")
        return await self._membership(self.replica.add_peer, replica_id, address, timeout_s)

    async def remove_replica(self, to: str, timeout_s: float | None = None) -> int:
        """Remove member `to` (replica id, brokerId or Raft address) from this group; master only. Removing the
        master itself is refused: transferLeader first."""
        return await self._membership(self.replica.remove_peer, await self._replica_id_of(to), timeout_s)

    async def _membership(self, call, *args) -> int:
        try:
            return await asyncio.to_thread(call, *args)
        except dledger.MembershipRefusedError as exc:
            raise BadRequestError(f"membership unchanged: {exc.message}") from None
        except dledger.MembershipChangePendingError as exc:
            raise PreconditionFailedError(f"membership unchanged: {exc.message}") from None
        except dledger.CommitUnknownError as exc:
            raise OutcomeUnknownError(exc.message) from None
        except dledger.NotLeaderError as exc:
            raise await self._not_master(exc.leader_id) from None

    async def _not_master(self, leader: str | None) -> NotMasterError:
        """The refusal of an admin call only the master makes, naming the master and its client address."""
        address = await self._client_address_of(leader) if leader else None
        return NotMasterError(f"replica {self.config.dLegerSelfId} is not the master of {self.config.brokerName}; "
                              f"the master is {leader or 'not known right now'}"
                              f"{' at ' + address if address else ''}: ask it", address)

    async def _replica_id_of(self, to: str) -> str:
        """A replica id from what an operator may give: the id, a brokerId (1.. as slaves are numbered), a Raft
        address, or a client address the NameServers know. Anything else is passed on and refused by name."""
        peers = self.replica.status().members or self.config.peers
        if to in peers:
            return to
        by_raft = {addr: pid for pid, addr in peers.items()}
        if to in by_raft:
            return by_raft[to]
        if to.isascii() and to.isdigit() and 1 <= int(to) <= len(peers):
            return sorted(peers)[int(to) - 1]
        if self.replica_addresses is not None:
            try:
                by_client = {addr: pid for pid, addr in (await self.replica_addresses()).items()}
            except Exception as exc:  # noqa: BLE001 - the refusal then names the peers
                log.warning("cannot look up replica addresses: %s", exc)
                by_client = {}
            if to in by_client:
                return by_client[to]
        return to

    # -- time -------------------------------------------------------------------------------------------------
    async def now_ms(self, deadline: float | None = None) -> int:
        """The group time (dledger/groupclock.py), never this host's wall clock: every time that goes into a
        command (store timestamps, delivery times, invisibility deadlines, retention cutoffs) or decides what is
        due. Waits up to GROUP_TIME_WAIT_S (or the deadline, time.monotonic()) while the group has none yet, then
        raises a retryable HA_NOT_AVAILABLE naming why."""
        try:
            return self.replica.group_time_ms()
        except dledger.NoGroupTimeError:
            pass
        give_up = time.monotonic() + GROUP_TIME_WAIT_S
        if deadline is not None:
            give_up = min(give_up, deadline)
        while True:
            await asyncio.sleep(GROUP_TIME_POLL_S)
            try:
                return self.replica.group_time_ms()
            except dledger.NoGroupTimeError as exc:
                if time.monotonic() >= give_up:
                    raise from_dledger(exc) from None

    # -- reads and writes -----------------------------------------------------------------------------------
    def read(self, fn):
        """fn(txn) in a read transaction of this replica's committed, applied state."""
        return self.store.read(fn)

    async def commit(self, command: spb.Command, repeatable: bool = False):
        """Commit one command through Raft; returns the state machine's result, raises its refusal."""
        await self.require_writable()
        outcome = (await self.batcher.submit_many([command.SerializeToString()], repeatable))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def submit(self, payloads: list[bytes], repeatable: bool = False, deadline: float | None = None) -> list:
        """Commit encoded commands through Raft as one submission; each one's result or protocol error. With a
        deadline (time.monotonic()) it waits no longer (batcher.py says what is answered then)."""
        return await self.batcher.submit_many(payloads, repeatable, deadline)

    async def require_writable(self) -> None:
        """With slaveForwardEnable=false, a replica that is not the master refuses writes (instead of forwarding
        them through Raft) with an error naming the master, as a RocketMQ slave would."""
        if self.config.slaveForwardEnable:
            return
        st = self.status
        if st.role in (dledger.Role.LEADER, dledger.Role.LEADER_PENDING):
            return
        if st.role is dledger.Role.STOPPED:  # no slave either: it names no master and forwards nothing
            raise StoreUnavailableError(f"store unavailable: this replica stopped after an error ({st.failure})")
        cfg = self.config
        where = (f"replica {cfg.dLegerSelfId} of broker group {cfg.brokerName} is a slave ({st.role.value}) and "
                 "slaveForwardEnable=false, so it does not forward writes")
        if not st.leader_id:
            raise NotMasterError(f"{where}; no master is known right now (election in progress): refresh the "
                                 "topic route (QueryRoute) and retry shortly")
        address = await self._client_address_of(st.leader_id)
        at = address or "an address the NameServers do not know yet"
        raise NotMasterError(f"{where}; the master is {st.leader_id} at {at}: refresh the topic route (QueryRoute) "
                             "and send to the master", address)

    async def _client_address_of(self, replica_id: str) -> str | None:
        if self.replica_addresses is None:
            return None
        try:
            return (await self.replica_addresses()).get(replica_id)
        except Exception as exc:  # noqa: BLE001 - the refusal still names the master's id
            log.warning("cannot look up the address of replica %s: %s", replica_id, exc)
            return None
