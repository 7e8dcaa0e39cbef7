"""The fuzzer (python -m devkit.fuzz, docs/fuzzing.md): a short run in the suite, and its verdicts."""

import json
import subprocess
import sys

import grpc

from devkit.fuzz.calls import judge_response, judge_status
from devkit.fuzz.run import BROKER_ADMIN, BROKER_AUTH, NAME_SERVER, V2
from rocketraft.protocol.wire import Code, ipb, pb, svc

REQUESTS = 25


def test_a_short_fuzz_of_every_rpc_of_every_service_finds_no_crash_hang_or_traceback(tmp_path):
    report = tmp_path / "fuzz.json"
    run = subprocess.run([sys.executable, "-m", "devkit.fuzz", "--requests", str(REQUESTS), "--seed", "3",
                          "--dir", str(tmp_path / "cluster"), "--json", str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    results = json.loads(report.read_text())
    fuzzed = {(r["server"].split()[0], r["rpc"]) for r in results if r["requests"] == REQUESTS}
    expected = {("namesrv", f"MessagingService.{m.name}") for m in V2.methods} \
        | {("namesrv", f"NameServer.{m.name}") for m in NAME_SERVER.methods} \
        | {(role, f"{s.name}.{m.name}") for role in ("master", "follower") for s in (V2, BROKER_ADMIN, BROKER_AUTH)
           for m in s.methods}
    assert expected <= fuzzed, f"not fuzzed: {sorted(expected - fuzzed)}"
    assert sum(r["ok"] for r in results if r["rpc"] == "MessagingService.SendMessage") > 0, "no valid send"
    assert results[-1]["rpc"] == "send and receive after fuzzing" and results[-1]["ok"] == 1


def test_an_internal_error_a_refusal_without_a_message_and_a_hang_are_defects():
    assert judge_response(svc.SendMessageResponse(status=pb.Status(code=Code.INTERNAL_ERROR, message="x"))).kind \
        == "defect"
    assert judge_response(ipb.BrokerChangeResponse(code=Code.BAD_REQUEST, message=" ")).kind == "defect"
    assert judge_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", 15.0).kind == "defect"
    assert judge_status(grpc.StatusCode.UNKNOWN, "Exception calling application", 0.0).kind == "defect"
    assert judge_status(grpc.StatusCode.INVALID_ARGUMENT, "", 0.0).kind == "defect"


def test_a_named_refusal_and_a_success_are_not_defects():
    refused = judge_response(svc.SendMessageResponse(status=pb.Status(code=Code.ILLEGAL_TOPIC, message="bad")))
    assert (refused.kind, refused.detail) == ("refused", "ILLEGAL_TOPIC")
    assert judge_response(svc.QueryRouteResponse(status=pb.Status(code=Code.OK, message="OK"))).kind == "ok"
    assert judge_response(ipb.GetClusterInfoResponse()).kind == "ok"
    assert judge_status(grpc.StatusCode.INVALID_ARGUMENT, "not a valid request", 0.0).kind == "refused"


def test_a_traceback_counts_where_it_begins_a_line_or_a_log_record_never_echoed_inside_a_message():
    from devkit.fuzz.run import TRACEBACK_AT

    assert TRACEBACK_AT.search("2026-11-23 23:40:10,895 ERROR broker-a/n0 broker.errors: unexpected error\n"
                               "Traceback (most recent call last):\n  File ...")
    assert TRACEBACK_AT.search("2026-11-23 23:40:10,895 ERROR grpc._server: Exception calling application: x")
    assert TRACEBACK_AT.search("2026-11-23 23:40:10,895 ERROR broker-a/n0 grpc._cython: Exception iterating x")
    # a fuzzed group name echoed in a refusal (seen in a 10,000-per-RPC run): not a traceback
    assert not TRACEBACK_AT.search("2026-11-23 23:30:08,954 WARNING namesrv: refused registration of replica '' of "
                                   "group 'Exception iterating': cluster, group and replica_id must all be set")
