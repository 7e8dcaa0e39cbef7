"""The proof of the cluster secret: what the verifier accepts and how it names each refusal."""

from __future__ import annotations

import asyncio

import pytest

from rocketraft.protocol import auth_internal
from rocketraft.protocol.auth_internal import SecretError, load_secret, proof
from serverkit.auth_audience import Audiences
from serverkit.auth_verify import Verifier

SECRET = "0123456789abcdef0123"
METHOD = "/rocketraft.internal.v1.NameServer/DeleteTopic"
HERE = "127.0.0.1:9876"
REQUEST = b"\x0a\x06orders"


def verifier(now_ms: int = 1_000_000, **kw) -> Verifier:
    return Verifier(SECRET, clock_ms=lambda: now_ms, audiences=Audiences(listening=[HERE]), **kw)


def refusal(v: Verifier, metadata, request=REQUEST, method=METHOD) -> str | None:
    return asyncio.run(v.refusal(method, metadata, auth_internal.request_digest(request)))


def signed(now_ms: int = 1_000_000, audience: str = HERE, request=REQUEST, method=METHOD, secret=SECRET):
    return proof(secret, method, audience, request, now_ms=now_ms)


def test_a_fresh_proof_is_accepted_once_and_its_replay_is_refused():
    v = verifier()
    metadata = signed()
    assert refusal(v, metadata) is None
    assert "replayed" in refusal(v, metadata)


def test_a_proof_for_another_method_request_or_secret_does_not_match():
    assert "does not match" in refusal(verifier(), signed(method="/x/CreateTopic"))
    assert "does not match" in refusal(verifier(), signed(secret="another-secret-0123456"))
    # issue 30, item 1: an observed proof carried by another request (a replayed CreateUser naming a SUPER user)
    assert "does not match this call" in refusal(verifier(), signed(), request=b"\x0a\x05other")


def test_a_proof_made_for_another_server_is_refused_naming_both_and_the_setting():
    message = refusal(verifier(), signed(audience="127.0.0.1:9877"))
    assert "127.0.0.1:9877" in message and HERE in message and "clusterAuthAudiences" in message
    extra = Verifier(SECRET, clock_ms=lambda: 1_000_000,
                     audiences=Audiences(listening=[HERE], addresses=["ns.example:9876"]))
    assert refusal(extra, signed(audience="ns.example:9876")) is None


def test_a_proof_in_the_format_before_2026_11_27_is_refused_unless_the_server_accepts_it_for_an_upgrade():
    time_ms, nonce = "1000000", "ab" * 16
    old = ((auth_internal.HEADER_TIME, time_ms), (auth_internal.HEADER_NONCE, nonce),
           (auth_internal.LEGACY_HEADER_SIGNATURE, auth_internal.legacy_signature(SECRET, METHOD, time_ms, nonce)))
    message = refusal(verifier(), old)
    assert "clusterAuthLegacyProofs" in message and "upgrade the caller" in message
    assert refusal(verifier(legacy_proofs=True), old) is None
    # a server during the upgrade adds the older proof to its calls: an old server accepts it; an upgraded one
    # decides by the new proof only, so stripping the new one leaves a proof only an upgrading server accepts
    both = proof(SECRET, METHOD, HERE, REQUEST, now_ms=1_000_000, legacy=True)
    assert refusal(verifier(), both) is None
    stripped = tuple(kv for kv in both if kv[0] != auth_internal.HEADER_PROOF)
    assert "clusterAuthLegacyProofs" in refusal(verifier(), stripped)


def test_no_proof_names_the_keys_to_set():
    message = refusal(verifier(), ())
    assert auth_internal.SECRET_ENV in message and "clusterSecret" in message


def test_a_proof_outside_the_window_is_refused_naming_the_setting():
    v = verifier(window_ms=1000)
    assert "clusterAuthWindowMillis" in refusal(v, signed(now_ms=1_000_000 - 1001))
    assert refusal(v, signed(now_ms=1_000_000 + 999)) is None


def test_the_replay_memory_is_bounded_and_refuses_a_flood_by_name():
    v = verifier(nonces_max=3)
    for _ in range(3):
        assert refusal(v, signed()) is None
    assert "NONCES_MAX" in refusal(v, signed())


@pytest.mark.parametrize(("listening", "audience", "accepted"), [
    ("127.0.0.1:9876", "127.0.0.1:9876", True),
    ("127.0.0.1:9876", "LOCALHOST:9876", True),        # the same machine, by name
    ("127.0.0.1:9876", "127.0.0.2:9876", False),       # another replica on another loopback address, same port
    ("127.0.0.1:9876", "127.0.0.1:9877", False),       # another server on this machine
    ("0.0.0.0:9876", "127.0.0.1:9876", True),          # listening everywhere: this machine's own addresses
    ("0.0.0.0:9876", "localhost:9876", True),
    ("0.0.0.0:9876", "localhost:9877", False),
    ("0.0.0.0:9876", "192.0.2.1:9876", False),         # TEST-NET-1: never this machine's
    ("[::1]:9876", "[::1]:9876", True),
])
def test_which_audiences_a_server_answers_to(listening, audience, accepted):
    answer = asyncio.run(Audiences(listening=[listening]).refusal(audience))
    assert (answer is None) == accepted, answer


def test_the_secret_comes_from_value_then_file_then_environment_and_has_no_default(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-the-file-0123456789\n")
    assert load_secret(environ={}) == ""
    assert load_secret("given-value-0123456789", str(path), environ={}) == "given-value-0123456789"
    assert load_secret(path=str(path), environ={}) == "from-the-file-0123456789"
    assert load_secret(environ={auth_internal.SECRET_ENV: "from-the-env-0123456789"}) == "from-the-env-0123456789"
    assert load_secret(environ={auth_internal.SECRET_FILE_ENV: str(path)}) == "from-the-file-0123456789"
    with pytest.raises(SecretError, match="at least 16"):
        load_secret("short", environ={})
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(path=str(tmp_path / "missing"), environ={})


def test_a_channels_signers_add_their_metadata_to_calls_of_every_kind_streams_included():
    """grpc.aio files an interceptor under only the first call kind it is an instance of: signing objects of all four
    kinds once left ReceiveMessage, PullMessage and Telemetry (and the namespace header) unsigned."""
    import grpc

    seen: dict[str, str] = {}

    def record(kind: str, context) -> None:
        seen[kind] = dict(context.invocation_metadata()).get("x-test-signed", "")

    async def unary_unary(request, context):
        record("unary_unary", context)
        return b""

    async def unary_stream(request, context):
        record("unary_stream", context)
        yield b""

    async def stream_unary(requests, context):
        record("stream_unary", context)
        async for _ in requests:
            pass
        return b""

    async def stream_stream(requests, context):
        record("stream_stream", context)
        async for _ in requests:
            yield b""

    async def scenario():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
            "UU": grpc.unary_unary_rpc_method_handler(unary_unary),
            "US": grpc.unary_stream_rpc_method_handler(unary_stream),
            "SU": grpc.stream_unary_rpc_method_handler(stream_unary),
            "SS": grpc.stream_stream_rpc_method_handler(stream_stream)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        signers = [lambda call: (("x-test-signed", call.method),)]
        address = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(address, interceptors=auth_internal.signing_interceptors(
                signers, audience=address)) as channel:
            await channel.unary_unary("/t.S/UU")(b"", timeout=5)
            async for _ in channel.unary_stream("/t.S/US")(b"", timeout=5):
                pass
            await channel.stream_unary("/t.S/SU")(iter([b""]), timeout=5)
            async for _ in channel.stream_stream("/t.S/SS")(iter([b""]), timeout=5):
                pass
        await server.stop(0)

    asyncio.run(scenario())
    assert seen == {"unary_unary": "/t.S/UU", "unary_stream": "/t.S/US", "stream_unary": "/t.S/SU",
                    "stream_stream": "/t.S/SS"}
