"""A replica never truncates an entry it has applied: a leader whose log conflicts with one stops the replica
with AppliedEntryConflictError (pysyncobj only logged "state machine may have diverged" and went on)."""

from __future__ import annotations

import pytest

from dledger.errors import AppliedEntryConflictError
from dledger.journal import LmdbJournal
from dledger.store import Store

MAP_SIZE_BYTES = 16 << 20


@pytest.fixture
def journal(tmp_path):
    store = Store(str(tmp_path / "store"), MAP_SIZE_BYTES)
    journal = LmdbJournal(store, cache_bytes_max=1 << 20)
    for index in range(1, 11):
        journal.add(b"c%d" % index, index, 2)
    store.commit()
    yield journal
    store.close()


def test_truncating_an_applied_entry_raises_and_keeps_the_log(journal):
    journal.applied_index = 7
    with pytest.raises(AppliedEntryConflictError, match="entries 6..10 .* applied them through 7"):
        journal.deleteEntriesFrom(5)  # position 5 = index 6
    assert (journal.first_index, journal.last_index) == (1, 10)


def test_truncating_only_entries_past_the_applied_index_is_allowed(journal):
    journal.applied_index = 7
    journal.deleteEntriesFrom(7)  # index 8 onwards: never applied
    assert journal.last_index == 7
