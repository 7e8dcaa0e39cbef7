"""Leadership transfer on three real replica processes (127.0.0.11-13): to a named follower and to the most
up-to-date voter, under a stream of appends; nothing acknowledged is lost and appends go on on the new leader;
asks on a follower, for an unknown replica or for the leader itself are refused by name. A replica preparing to
stop says whether it leads, and a stopping leader still hands over."""

from __future__ import annotations

import os
import signal
import threading
import time

from dledger_workload import AppendStream, check_history, eventually

from devkit.pause import pause

TRANSFER_TIMEOUT_S = 5.0


def transfer(cluster, node_id: str, to: str | None) -> dict:
    return cluster.client(node_id).call("transfer_leadership", timeout_s=TRANSFER_TIMEOUT_S + 5, to=to)


def prevote_rounds(cluster) -> int:
    return sum(cluster.client(n).call("stats")["prevote_rounds"] for n in cluster.nodes)


def acks_after(history, t: float) -> int:
    return sum(1 for a in history.ack_times if a > t)


def longest_gap_s(ack_times: list[float], start: float, end: float) -> float:
    times = [start] + [t for t in ack_times if start < t < end] + [end]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def test_transfer_to_a_named_follower_then_to_the_best_voter_loses_nothing_appends_resume_and_bad_asks_are_refused(
        make_cluster):
    cluster = make_cluster()
    old = cluster.wait_leader()
    cluster.wait_connected()
    stream = AppendStream(cluster, "xfer")
    stream.start()
    eventually(lambda: len(stream.history.acked) > 50, "appends acknowledged before the transfer")

    prevotes_before = prevote_rounds(cluster)
    named = sorted(n for n in cluster.nodes if n != old)[0]
    started = time.monotonic()
    reply = transfer(cluster, old, named)
    took_s = time.monotonic() - started
    assert reply == {"leader_id": named}, reply
    assert cluster.wait_leader(among=[named], timeout_s=5) == named
    eventually(lambda: acks_after(stream.history, started + took_s) > 20, "appends acknowledged by the new leader")

    t2 = time.monotonic()
    reply = transfer(cluster, named, None)
    assert reply.get("leader_id") in set(cluster.nodes) - {named}, reply
    eventually(lambda: acks_after(stream.history, time.monotonic() - 0.5) > 5 and acks_after(stream.history, t2) > 20,
               "appends acknowledged after the second transfer")
    history = stream.stop()

    gap_s = longest_gap_s(history.ack_times, started - 0.5, time.monotonic())
    print(f"longest ack gap around two transfers: {gap_s * 1000:.0f} ms; first transfer took {took_s * 1000:.0f} ms")
    assert gap_s < 2.0, f"appends stalled {gap_s:.2f} s around the transfers (an election would show here)"
    last = max(history.acked.values())
    cluster.wait_applied(last)
    check_history(cluster, history, list(cluster.nodes))
    assert prevote_rounds(cluster) == prevotes_before, "a transfer must not go through a timed-out election"

    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    on_follower = transfer(cluster, follower, None)
    assert on_follower["error"] == "NOT_LEADER" and on_follower["leader_id"] == leader, on_follower
    unknown = transfer(cluster, leader, "n9")
    assert unknown["error"] == "TRANSFER_REFUSED" and "not a peer" in unknown["message"], unknown
    itself = transfer(cluster, leader, leader)
    assert itself["error"] == "TRANSFER_REFUSED" and "is this replica" in itself["message"], itself
    assert cluster.leader() == leader
    assert "index" in cluster.append(leader, [b"after-refusals"]), "a refused transfer left appends blocked"


def test_prepare_to_stop_tells_a_follower_it_does_not_lead_and_the_leader_it_does_and_the_leader_still_hands_over(
        make_cluster):
    cluster = make_cluster()
    old = cluster.wait_leader()
    cluster.wait_connected()
    first, second = sorted(n for n in cluster.nodes if n != old)
    assert cluster.client(first).call("prepare_to_stop") == {"leads": False}
    assert cluster.client(old).call("prepare_to_stop") == {"leads": True}
    assert cluster.client(old).call("prepare_to_stop") == {"leads": True}, "asked twice, it still leads"

    stopping = transfer(cluster, old, first)
    assert stopping["error"] == "TRANSFER_REFUSED" and f"{first} is stopping" in stopping["message"], stopping
    assert transfer(cluster, old, second) == {"leader_id": second}
    assert cluster.wait_leader(among=[second], timeout_s=5) == second
    assert cluster.client(old).call("prepare_to_stop") == {"leads": False}, "stepped down, it leads no more"
    assert "index" in cluster.append(second, [b"after-the-stopping-leader-handed-over"])


def test_an_append_made_while_leadership_is_handed_over_is_refused_naming_the_target_and_stored_nowhere(
        make_cluster):
    """The target is paused, so the transfer cannot end: every append from its start on is refused (the leader's
    log must not outgrow the target's, or the leader would refuse it its vote); once resumed the target leads."""
    cluster = make_cluster()
    old = cluster.wait_leader()
    cluster.wait_connected()
    target = sorted(n for n in cluster.nodes if n != old)[0]
    pause(cluster.pid(target))
    replies: list[dict] = []
    handing = threading.Thread(target=lambda: replies.append(transfer(cluster, old, target)), daemon=True)
    sent: list[bytes] = []

    def refused_append() -> dict | None:
        sent.append(f"during-{len(sent)}".encode())
        reply = cluster.append(old, [sent[-1]])
        return reply if "error" in reply else None

    try:
        handing.start()
        # within the paused target's connection timeout (2.4 s): past it the leader gives the transfer up
        refused = eventually(refused_append, "an append on the leader refused while it hands leadership over",
                             timeout_s=2.0)
    finally:
        os.kill(cluster.pid(target), signal.SIGCONT)
    handing.join(TRANSFER_TIMEOUT_S + 10)
    assert refused["error"] == "NOT_LEADER" and refused["leader_id"] == target, refused
    assert f"being handed to {target}" in refused["message"], refused
    assert replies == [{"leader_id": target}], replies
    after = cluster.append(target, [b"after"])
    cluster.wait_applied(after["index"])
    for node in cluster.nodes:
        entries = cluster.client(node).call("read", from_index=1, max_entries=100_000)["entries"]
        assert [sent[-1]] not in [payloads for _i, _t, payloads in entries], f"{node} stored a refused append"
