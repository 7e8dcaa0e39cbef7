"""The fuzzer (python -m devkit.fuzz, docs/fuzzing.md): a short run in the suite, and its verdicts."""

import collections
import json
import subprocess
import sys

import grpc

from devkit.fuzz import access, templates
from devkit.fuzz.access import Who
from devkit.fuzz.calls import KNOWN_FINDINGS, judge_command, judge_response, judge_status, plan_of
from devkit.fuzz.frames import SERIALIZE_JSON, SERIALIZE_ROCKETMQ, request
from devkit.fuzz.run import (
    BROKER_ADMIN,
    BROKER_AUTH,
    NAME_SERVER,
    V2,
    broker_remoting_codes,
    code_name,
    namesrv_remoting_codes,
)
from rocketraft.protocol.wire import Code, ipb, pb, svc
from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request, Response

REQUESTS = 25
REMOTING_REQUESTS = 16  # per request code per server: 54 codes and servers, about 15 s of the run


def test_a_short_fuzz_of_every_rpc_of_every_service_finds_no_crash_hang_or_traceback(tmp_path):
    report = tmp_path / "fuzz.json"
    run = subprocess.run([sys.executable, "-m", "devkit.fuzz", "--requests", str(REQUESTS), "--remoting-requests",
                          str(REMOTING_REQUESTS), "--seed", "3", "--dir", str(tmp_path / "cluster"), "--json",
                          str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    results = json.loads(report.read_text())
    fuzzed = {(r["server"].split()[0], r["rpc"]) for r in results if r["requests"] == REQUESTS}
    expected = {("namesrv", f"MessagingService.{m.name}") for m in V2.methods} \
        | {("namesrv", f"NameServer.{m.name}") for m in NAME_SERVER.methods} \
        | {(role, f"{s.name}.{m.name}") for role in ("master", "follower") for s in (V2, BROKER_ADMIN, BROKER_AUTH)
           for m in s.methods}
    assert expected <= fuzzed, f"not fuzzed: {sorted(expected - fuzzed)}"
    remoting = {(r["server"].split()[0], r["rpc"]) for r in results if r["requests"] == REMOTING_REQUESTS}
    expected_remoting = {("namesrv", f"Remoting.{code_name(c)}") for c in namesrv_remoting_codes()} \
        | {(role, f"Remoting.{code_name(c)}") for role in ("master", "follower") for c in broker_remoting_codes()}
    assert expected_remoting <= remoting, f"not fuzzed: {sorted(expected_remoting - remoting)}"
    assert sum(r["ok"] for r in results if r["rpc"] == "Remoting.SEND_MESSAGE_V2") > 0, "no valid Remoting send"
    assert sum(r["ok"] for r in results if r["rpc"] == "MessagingService.SendMessage") > 0, "no valid send"
    assert results[-1]["rpc"] == "send and receive after fuzzing" and results[-1]["ok"] == 1


def test_a_short_hardened_fuzz_mixes_credentials_into_every_rpc_and_finds_no_success_without_authorization(
        tmp_path):
    """--hardened: a cluster secret, ACL 2.0 and TLS permissive; every request goes with credentials of a kind drawn
    at random, and a success answered to one without the right would be a defect (docs/fuzzing.md)."""
    report = tmp_path / "fuzz.json"
    run = subprocess.run([sys.executable, "-m", "devkit.fuzz", "--hardened", "--requests", str(REQUESTS),
                          "--remoting-requests", str(REMOTING_REQUESTS), "--seed", "3", "--dir",
                          str(tmp_path / "cluster"), "--json", str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    results = json.loads(report.read_text())
    fuzzed = {(r["server"].split()[0], r["rpc"]) for r in results if r["requests"] == REQUESTS}
    assert {("namesrv", f"NameServer.{m.name}") for m in NAME_SERVER.methods} \
        | {(role, f"BrokerAuth.{m.name}") for role in ("master", "follower") for m in BROKER_AUTH.methods} <= fuzzed
    assert sum(r["requests"] == REMOTING_REQUESTS for r in results) == len(namesrv_remoting_codes()) \
        + 2 * len(broker_remoting_codes())
    outcomes = {"gRPC": collections.Counter(), "Remoting": collections.Counter()}
    for r in results[:-1]:
        outcomes["Remoting" if r["rpc"].startswith("Remoting.") else "gRPC"].update(r["credentials"])
    for door, kinds in (("gRPC", access.GRPC_CREDENTIALS), ("Remoting", access.REMOTING_CREDENTIALS)):
        sent = {key.split()[0] for key in outcomes[door]}
        assert sent == set(kinds), f"{door}: credentials never sent: {set(kinds) - sent}"
    for door, kind in (("gRPC", "super"), ("gRPC", "proof"), ("Remoting", "super"), ("Remoting", "tenant")):
        assert outcomes[door][f"{kind} ok"] > 0, f"{door}: no request with {kind} credentials was answered"
    for kind in ("none", "wrong-password", "unknown-user", "stale-signature", "proof-replayed"):
        assert outcomes["gRPC"][f"{kind} auth refused"] > 0, f"no request with {kind} credentials refused as such"
    assert results[-1]["rpc"] == "send and receive after fuzzing" and results[-1]["ok"] == 1


def test_hardened_a_success_is_judged_by_who_the_credentials_prove_and_what_the_call_needs():
    names = templates.Names()
    ours = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name=names.topic))])
    theirs = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="another-topic"))])
    send = access.grpc_rule(False, "MessagingService", "SendMessage", ours)
    assert access.may(Who.TENANT, send, names) is True
    assert access.may(Who.TENANT, send, names, namespaced=True) is False  # stored as "<namespace>%fuzz-topic"
    assert access.may(Who.TENANT, access.grpc_rule(False, "MessagingService", "SendMessage", theirs), names) is False
    assert access.may(Who.STRANGER, send, names) is False and access.may(Who.NOBODY, send, names) is False
    assert access.may(Who.SUPER, send, names) is True and access.may(Who.CLUSTER, send, names) is True
    producer = access.grpc_rule(False, "MessagingService", "Heartbeat", svc.HeartbeatRequest(
        group=pb.Resource(name="any-group"), client_type=pb.ClientType.PRODUCER))
    assert access.may(Who.STRANGER, producer, names) is True and access.may(Who.NOBODY, producer, names) is False
    # open by design: the NameServer answers the brokers' v2 calls "served by brokers"
    assert access.may(Who.NOBODY, access.grpc_rule(True, "MessagingService", "Heartbeat", producer), names) is True
    register = access.grpc_rule(True, "NameServer", "RegisterBroker", ipb.RegisterBrokerRequest())
    assert access.may(Who.SUPER, register, names) is False and access.may(Who.CLUSTER, register, names) is True
    cluster_info = access.grpc_rule(True, "NameServer", "GetClusterInfo", ipb.GetClusterInfoRequest())
    assert access.may(Who.SUPER, cluster_info, names) is True and access.may(Who.TENANT, cluster_info, names) is False
    assert access.grpc_may(Who.TENANT, False, "MessagingService", V2.methods_by_name["SendMessage"],
                           ours.SerializeToString(), (("x-mq-namespace", "ns"),), names) is False


def test_hardened_a_remoting_request_proves_its_signer_and_a_stored_message_is_not_judged_for_the_tenant():
    names = templates.Names()
    creds = access.Credentials("s" * 32, access.make_users())
    ext = {"b": names.topic, "a": "fuzz-producer"}
    signed = creds.remoting_signer("tenant")(ext, b"body")
    assert creds.remoting_who(signed, b"body") is Who.TENANT
    assert creds.remoting_who(signed, b"another body") is Who.NOBODY
    assert creds.remoting_who(creds.remoting_signer("wrong-key")(ext, b"body"), b"body") is Who.NOBODY
    send = access.remoting_rule(Request.SEND_MESSAGE_V2, signed, b"body")
    assert access.may(Who.TENANT, send, names) is True and access.may(Who.STRANGER, send, names) is False
    commit = access.remoting_rule(Request.END_TRANSACTION, {"commitOrRollback": "8", "commitLogOffset": "1"}, b"")
    assert access.may(Who.TENANT, commit, names) is None and access.may(Who.STRANGER, commit, names) is False
    unknown = access.remoting_rule(Request.END_TRANSACTION, {"commitOrRollback": "0"}, b"")  # nothing happens
    assert access.may(Who.STRANGER, unknown, names) is True and access.may(Who.NOBODY, unknown, names) is False


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


def test_every_request_code_of_the_remoting_doors_is_fuzzed_and_unknown_codes_too():
    broker = set(broker_remoting_codes())
    assert {Request.SEND_MESSAGE_V2, Request.PULL_MESSAGE, Request.HEART_BEAT, Request.END_TRANSACTION} <= broker
    assert Request.GET_ROUTEINFO_BY_TOPIC in namesrv_remoting_codes()
    assert "UNKNOWN_CODE" in {code_name(c) for c in broker} & {code_name(c) for c in namesrv_remoting_codes()}


def test_a_remoting_answer_is_judged_by_its_code_and_remark():
    ask = frame.Command(Request.GET_MAX_OFFSET, opaque=5)
    assert judge_command(ask.response(Response.SUCCESS)).kind == "ok"
    refused = judge_command(ask.response(Response.TOPIC_NOT_EXIST, "no topic x"))
    assert (refused.kind, refused.detail) == ("refused", "TOPIC_NOT_EXIST")
    assert judge_command(ask.response(Response.SYSTEM_ERROR, "internal error: KeyError: 'x'")).kind == "defect"
    assert judge_command(ask.response(Response.INVALID_PARAMETER, " ")).kind == "defect"


def test_the_plan_of_a_write_tells_answers_oneways_and_malformed_frames_apart():
    valid = request(Request.GET_MAX_OFFSET, {"topic": "t", "queueId": "0"}, b"", SERIALIZE_ROCKETMQ, 9)
    assert plan_of(valid).answers == [(9, SERIALIZE_ROCKETMQ)] and not plan_of(valid).closes
    assert plan_of(valid + valid).answers == [(9, SERIALIZE_ROCKETMQ)] * 2  # two answers with one opaque
    oneway = request(Request.UNREGISTER_CLIENT, {}, b"", SERIALIZE_JSON, 3, flag=2)
    assert plan_of(oneway).answers == [] and not plan_of(oneway).closes
    for bad in (valid[:-1], b"\x00\x00", b"\x7f\xff\xff\xff", valid[:4] + b"\x05" + valid[5:]):
        assert plan_of(bad).closes and plan_of(bad).warns, bad
    assert plan_of(b"").closes and not plan_of(b"").warns  # no frame at all: closed without a word
    # a permissive TLS port (--hardened) reads a first byte 0x16 as a TLS handshake: closed with no frame's WARNING
    handshake_like = b"\x16" + valid[1:]
    assert plan_of(handshake_like).warns
    assert plan_of(handshake_like, tls_permissive=True).closes and not plan_of(handshake_like, True).warns


def test_known_findings_name_their_reason():
    for known in KNOWN_FINDINGS:
        assert known.name and len(known.reason) > 40
