"""Online repair of a corrupt stored entry from the group's other replicas.

A replica that finds an entry of its own store failing its check (a read, the apply loop, a send to a follower,
the scrub) never serves it; it asks every connected peer for that entry:

    {"type": "dl_fetch_entry", "index": i, "term": t}
    {"type": "dl_fetch_entry_resp", "index": i, "term": t, "command": bytes | None, "reason": str}

A peer answers with its stored command only if it holds index i with term t and that copy verifies; by Raft's
log matching property it is then the very entry this replica lost. The first answer that verifies here too
replaces the stored copy (LmdbJournal.replace, durable at the tick's commit) and is logged at WARNING ("repaired
entry i (term t) from n2"). When every peer of the group has answered without a good copy, the entry is lost on
this replica: logged once at ERROR, still refused, asked for again every LOST_RETRY_ROUNDS rounds. A round
without every answer is repeated after `repair_round_ms`.

Everything here runs on the tick thread, except `request` (any thread: readers, the scrub).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from .errors import EntryCorruptError
from .journal import LmdbJournal
from .logformat import TERM_BYTES, value_term, verify_command, verify_value
from .store import Store

log = logging.getLogger(__name__)

FETCH = "dl_fetch_entry"
FETCH_RESP = "dl_fetch_entry_resp"
LOST_RETRY_ROUNDS = 30  # a lost entry is asked for again this many rounds later (a lagging peer may get it)
WANTED_MAX = 1024  # entries under repair at once; more wait for the next scrub pass or read that finds them


@dataclass
class _Repair:
    term: int
    asked: set = field(default_factory=set)  # peer addresses asked in the current round
    refused: dict = field(default_factory=dict)  # peer address -> why it had no good copy (current round)
    round_ends_at: float = 0.0
    next_round_at: float = 0.0
    lost: bool = False


class RepairLink(Protocol):
    """What a repair needs of the replica's Raft engine (tick thread, except wake)."""

    def wake(self) -> None: ...

    def repair_peers(self) -> list:
        """Peers a repair may ask: connected, with an accepted hello (same group and history)."""

    def send_to_peer(self, node, message: dict) -> None: ...

    def other_peer_addresses(self) -> set[str]: ...

    def peer_id(self, address: str | None) -> str | None: ...


class Repairs:
    def __init__(self, link: RepairLink, journal: LmdbJournal, store: Store, repair_round_ms: int):
        self._link = link
        self._journal = journal
        self._store = store
        self._round_s = repair_round_ms / 1000
        self._lock = threading.Lock()
        self._requested: dict[int, int] = {}
        self._wanted: dict[int, _Repair] = {}
        self._overflow_logged = False
        self.stats = {"corrupt_found": 0, "repaired": 0, "lost": 0, "repair_fetches_sent": 0}

    # -- any thread ------------------------------------------------------------------------------------
    def request(self, index: int, term: int) -> None:
        """Someone found entry index (term) failing its check: confirm it on the tick thread and repair it."""
        with self._lock:
            if len(self._requested) < WANTED_MAX:
                self._requested[index] = term
        self._link.wake()

    # -- tick thread -----------------------------------------------------------------------------------
    def is_lost(self, index: int) -> bool:
        repair = self._wanted.get(index)
        return repair is not None and repair.lost

    @property
    def pending(self) -> int:
        return len(self._wanted)

    def tick(self) -> None:
        with self._lock:
            requested, self._requested = self._requested, {}
        for index, term in requested.items():
            self._confirm(index, term)
        if not self._wanted:
            return
        corrupt = self._journal.corrupt
        now = time.monotonic()
        for index, repair in list(self._wanted.items()):
            if index not in corrupt:  # truncated, compacted or replaced by a snapshot: nothing left to repair
                del self._wanted[index]
            elif repair.asked and now >= repair.round_ends_at:
                self._end_round(index, repair, now)
            elif not repair.asked and now >= repair.next_round_at:
                self._start_round(index, repair, now)

    def _confirm(self, index: int, term: int) -> None:
        if index in self._wanted:
            return
        journal = self._journal
        value = journal.stored_value(index)
        if value is None or value_term(value) != term:
            journal.forget_corrupt(index)
            return
        try:
            verify_command(memoryview(value)[TERM_BYTES:], journal.method_id)
            journal.forget_corrupt(index)  # repaired meanwhile (the report raced with the repair)
            return
        except EntryCorruptError as exc:
            detail = exc.message
        if len(self._wanted) >= WANTED_MAX:
            if not self._overflow_logged:
                self._overflow_logged = True
                log.error("more than %d corrupt entries under repair; entry %d waits for a later scrub pass",
                          WANTED_MAX, index)
            return
        journal.mark_corrupt(index, term)
        self._wanted[index] = _Repair(term)
        self.stats["corrupt_found"] += 1
        log.warning("entry %d (term %d) in %s is corrupt (%s): not served; asking the other replicas for a verified "
                    "copy", index, term, self._store.path, detail)

    def _start_round(self, index: int, repair: _Repair, now: float) -> None:
        round_s = self._round_s
        peers = self._link.repair_peers()
        repair.refused = {}
        if not peers:
            repair.next_round_at = now + round_s
            return
        for node in peers:
            self._link.send_to_peer(node, {"type": FETCH, "index": index, "term": repair.term})
        self.stats["repair_fetches_sent"] += len(peers)
        repair.asked = {node.address for node in peers}
        repair.round_ends_at = now + round_s

    def _end_round(self, index: int, repair: _Repair, now: float) -> None:
        round_s = self._round_s
        everyone = self._link.other_peer_addresses()
        if set(repair.refused) >= everyone:
            if not repair.lost:
                repair.lost = True
                self.stats["lost"] += 1
                answers = ", ".join(f"{self._link.peer_id(a)}: {why}" for a, why in sorted(repair.refused.items()))
                log.error("entry %d (term %d) is lost on this replica: no other replica has a verified copy (%s). "
                          "It stays refused; rebuild this replica from its peers if it is needed "
                          "(docs/operations.md, 'entry N is corrupt')", index, repair.term, answers)
            repair.next_round_at = now + round_s * LOST_RETRY_ROUNDS
        else:
            repair.next_round_at = now + round_s
        repair.asked = set()

    def on_message(self, node, message: dict) -> None:
        if message.get("type") == FETCH:
            self._answer(node, message)
        else:
            self._on_answer(node, message)

    def _answer(self, node, message: dict) -> None:
        index, term = message["index"], message["term"]
        journal = self._journal
        value = journal.stored_value(index)
        command, reason = None, ""
        if value is None:
            reason = "not in its log"
        elif value_term(value) != term:
            reason = f"it holds term {value_term(value)} at that index"
        else:
            try:
                verify_value(index, value, journal.method_id, self._store.path)
                command = bytes(value[TERM_BYTES:])
            except EntryCorruptError:
                reason = "its copy is corrupt too"
                self.request(index, term)
        self._link.send_to_peer(node, {"type": FETCH_RESP, "index": index, "term": term, "command": command,
                                         "reason": reason})

    def _on_answer(self, node, message: dict) -> None:
        index, term = message["index"], message["term"]
        repair = self._wanted.get(index)
        if repair is None or repair.term != term or node.address not in repair.asked:
            return  # repaired already, or an answer to a round that is over
        command = message.get("command")
        if command is not None:
            journal = self._journal
            try:
                verify_command(command, journal.method_id)
            except EntryCorruptError as exc:
                reason = f"its copy failed the check here ({exc.message})"
            else:
                del self._wanted[index]
                if journal.replace(index, command, term):
                    self.stats["repaired"] += 1
                    log.warning("repaired entry %d (term %d) from %s", index, term,
                                self._link.peer_id(node.address) or node.address)
                return
        else:
            reason = message.get("reason") or "no reason given"
        repair.refused[node.address] = reason
        if set(repair.refused) >= repair.asked:
            self._end_round(index, repair, time.monotonic())
