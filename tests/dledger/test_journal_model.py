"""Model-based property test: LmdbJournal behaves like a plain Python list of (command, index, term)
tuples (pysyncobj's MemoryJournal semantics), with deleteEntriesTo capped as documented, and its
committed state -- log, term, vote, commit index -- survives closing and reopening the store, while
uncommitted writes are rolled back.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import dledger.journal as journal_module
from dledger import logformat
from dledger.codec import encode_batch
from dledger.journal import JournalSlice, LmdbJournal
from dledger.store import Store

MAP_SIZE_BYTES = 16 << 20

# What pysyncobj stores: its no-op, or a data command holding a batch (bulk reads verify every command read back).
commands = st.one_of(st.just(logformat.NO_OP_COMMAND), st.lists(st.binary(max_size=40), min_size=1, max_size=3).map(
    lambda payloads: logformat.REGULAR_COMMAND + logformat.encode_call(0, encode_batch(payloads))))
positions = st.integers(min_value=0, max_value=60)
terms = st.integers(min_value=0, max_value=2**40)
node_ids = st.one_of(st.none(), st.text(min_size=1, max_size=12))


def capped_delete_to(model: list, pos: int, delete_upto_max: int) -> list:
    """The documented cap: never remove an index > delete_upto_max, always keep the last 2 entries."""
    if not model:
        return model
    first, last = model[0][1], model[-1][1]
    new_first = min(first + pos, delete_upto_max + 1, last - 1)
    if new_first <= first:
        return model
    return model[new_first - first :]


class JournalVsListModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="journal-model-")
        self.store: Store | None = None
        self.journal: LmdbJournal | None = None
        self.saved_iter_chunk = journal_module.ITER_CHUNK
        # live state (what the journal must show now) and committed state (what a reopen must show)
        self.model: list = []
        self.committed: list = []
        self.commit_index = 1
        self.committed_commit_index = 1
        self.term = 0
        self.voted = None

    # -- setup / teardown ---------------------------------------------------------------------------
    @initialize(
        cache_bytes_max=st.sampled_from([0, 200, 1 << 20]),
        iter_chunk=st.sampled_from([1, 3, 256]),
    )
    def open_journal(self, cache_bytes_max, iter_chunk):
        self.cache_bytes_max = cache_bytes_max
        # Small chunks make JournalSlice iteration cross chunk boundaries (cache hits and LMDB reads mixed).
        journal_module.ITER_CHUNK = iter_chunk
        self._open()

    def _open(self):
        self.store = Store(self.dir, MAP_SIZE_BYTES)
        self.journal = LmdbJournal(self.store, self.cache_bytes_max)

    def _close(self):
        self.store.close()
        self.store = self.journal = None

    def teardown(self):
        journal_module.ITER_CHUNK = self.saved_iter_chunk
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _next_index(self, data_index):
        if self.model:
            return self.model[-1][1] + 1
        return data_index

    # -- log mutations -------------------------------------------------------------------------------
    @rule(
        batch=st.lists(st.tuples(commands, st.integers(0, 2)), min_size=1, max_size=12),
        start_index=st.integers(min_value=1, max_value=1000),
    )
    def add(self, batch, start_index):
        """Append entries with index = last + 1 (any index when empty) and non-decreasing terms."""
        for command, term_step in batch:
            idx = self._next_index(start_index)
            term = (self.model[-1][2] if self.model else 0) + term_step
            self.journal.add(command, idx, term)
            self.model.append((command, idx, term))

    @rule()
    def clear(self):
        self.journal.clear()
        self.model = []

    @rule(pos=positions)
    def delete_entries_from(self, pos):
        self.journal.deleteEntriesFrom(pos)
        del self.model[pos:]

    @rule(pos=positions, data=st.data())
    def delete_entries_to(self, pos, data):
        low = self.model[0][1] - 2 if self.model else 0
        high = self.model[-1][1] + 2 if self.model else 5
        delete_upto_max = data.draw(st.integers(min_value=max(0, low), max_value=max(0, high)), label="delete_upto_max")
        self.journal.delete_upto_max = delete_upto_max
        self.journal.deleteEntriesTo(pos)
        self.model = capped_delete_to(self.model, pos, delete_upto_max)

    # -- durability ----------------------------------------------------------------------------------
    @rule(fsync=st.booleans())
    def commit(self, fsync):
        self.store.commit(fsync=fsync)
        self._mark_committed()

    @rule()
    def flush(self):
        self.journal.flush()
        self._mark_committed()
        assert self.journal.durable_index == (self.model[-1][1] if self.model else 0)

    def _mark_committed(self):
        self.committed = list(self.model)
        self.committed_commit_index = self.commit_index

    @rule(fsync=st.booleans())
    def commit_then_reopen(self, fsync):
        self.store.commit(fsync=fsync)
        self._mark_committed()
        self._close()
        self._open()

    @rule(explicit_abort=st.booleans())
    def reopen_without_commit_loses_uncommitted_writes(self, explicit_abort):
        if explicit_abort:
            self.store.abort()
        self._close()  # Store.close aborts an open write transaction
        self._open()
        self.model = list(self.committed)
        self.commit_index = self.committed_commit_index
        # term and vote were committed by setCurrentTerm itself: they survive

    # -- Raft metadata -------------------------------------------------------------------------------
    @rule(term=terms, voted=node_ids)
    def set_current_term(self, term, voted):
        """setCurrentTerm commits (and fsyncs) the whole open transaction, log writes included."""
        self.journal.setCurrentTerm(term, voted)
        self.term, self.voted = term, voted
        self._mark_committed()

    @rule(commit_index=st.integers(min_value=0, max_value=2000))
    def set_raft_commit_index(self, commit_index):
        self.journal.setRaftCommitIndex(commit_index)
        self.commit_index = commit_index

    # -- read-only probes with arguments -------------------------------------------------------------
    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def nested_slice_matches_model(self, data):
        n = len(self.model)
        bound = st.one_of(st.none(), st.integers(min_value=-n - 2, max_value=n + 2))
        a, b, c, d = (data.draw(bound, label=name) for name in "abcd")
        outer = self.journal[a:b]
        assert isinstance(outer, JournalSlice)
        inner = outer[c:d]
        assert isinstance(inner, list)
        assert inner == self.model[a:b][c:d]
        expected_outer = self.model[a:b]
        if expected_outer:
            i = data.draw(st.integers(min_value=-len(expected_outer), max_value=len(expected_outer) - 1), label="i")
            assert outer[i] == expected_outer[i]

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def length_and_bounds_match_model(self):
        assert len(self.journal) == len(self.model)
        assert self.journal.first_index == (self.model[0][1] if self.model else 0)
        assert self.journal.last_index == (self.model[-1][1] if self.model else 0)

    @invariant()
    def every_position_matches_model(self):
        n = len(self.model)
        if n:
            assert self.journal[0] == self.model[0]
            assert self.journal[-1] == self.model[-1]
        for i in range(n):
            assert self.journal[i] == self.model[i]
            assert self.journal[i - n] == self.model[i - n]
        for bad in (n, n + 1, -n - 1):
            try:
                self.journal[bad]
            except IndexError:
                pass
            else:
                raise AssertionError(f"journal[{bad}] with length {n} did not raise IndexError")

    @invariant()
    def slices_match_model(self):
        n = len(self.model)
        bounds = [None, *sorted({0, 1, 2, n // 2, n - 2, n - 1, n, n + 3, -1, -2, -n})]
        for a in bounds:
            for b in bounds:
                view = self.journal[a:b]
                expected = self.model[a:b]
                assert isinstance(view, JournalSlice)
                assert len(view) == len(expected)
                assert bool(view) == bool(expected)
                assert list(view) == expected
                assert list(reversed(view)) == expected[::-1]
        # slicing a JournalSlice returns a list
        for a, b, c, d in ((None, None, 1, None), (1, None, None, -1), (-3, None, 1, 2), (2, -1, 0, 100)):
            assert self.journal[a:b][c:d] == self.model[a:b][c:d]

    @invariant()
    def metadata_matches_model(self):
        assert self.journal.getCurrentTerm() == self.term
        assert self.journal.getVotedForNodeId() == self.voted
        assert self.journal.getRaftCommitIndex() == self.commit_index


JournalVsListModel.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_journal_matches_list_model_across_commit_abort_and_reopen = JournalVsListModel.TestCase
