"""hypothesis: whatever the sequence of appends and reopens, every committed entry is applied exactly once."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.counting import CountingStateMachine
from devkit.localcluster import free_port
from dledger import Replica, ReplicaConfig, Role

steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.binary(max_size=64), min_size=1, max_size=8)),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=1,
    max_size=8,
)


def open_replica(data_dir: str, address: str) -> Replica:
    config = ReplicaConfig(group_id="idem", self_id="solo", peers={"solo": address}, data_dir=data_dir,
                           heartbeat_interval_ms=20, election_timeout_min_ms=100, election_timeout_max_ms=200)
    replica = Replica.open(config, CountingStateMachine())
    replica.wait_for(lambda s: s.role is Role.LEADER, 10)
    return replica


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_apply_runs_once_per_committed_entry_across_reopens(ops):
    address = f"127.0.0.35:{free_port('127.0.0.35')}"
    with tempfile.TemporaryDirectory() as data_dir:
        replica = open_replica(data_dir, address)
        entries = payloads = 0
        try:
            for op, arg in ops:
                if op == "append":
                    replica.append(arg).result(5)
                    entries += 1
                    payloads += len(arg)
                else:
                    replica.close()
                    replica = open_replica(data_dir, address)
                    assert replica.state_machine.counts()["applied_since_open"] == 0
                counts = replica.state_machine.counts()
                assert (counts["entries"], counts["payloads"]) == (entries, payloads)
                assert replica.status().failure is None
        finally:
            replica.close()
