"""The proof of the cluster secret: what the verifier accepts and how it names each refusal."""

from __future__ import annotations

import pytest

from rocketraft.protocol import auth_internal
from rocketraft.protocol.auth_internal import SecretError, Verifier, load_secret, proof

SECRET = "0123456789abcdef0123"
METHOD = "/rocketraft.internal.v1.NameServer/DeleteTopic"


def verifier(now_ms: int = 1_000_000, **kw) -> Verifier:
    return Verifier(SECRET, clock_ms=lambda: now_ms, **kw)


def test_a_fresh_proof_is_accepted_once_and_its_replay_is_refused():
    v = verifier()
    metadata = proof(SECRET, METHOD, now_ms=1_000_000)
    assert v.refusal(METHOD, metadata) is None
    assert "replayed" in v.refusal(METHOD, metadata)


def test_a_proof_for_another_method_or_secret_does_not_match():
    assert "does not match" in verifier().refusal(METHOD, proof(SECRET, "/x/CreateTopic", now_ms=1_000_000))
    assert "does not match" in verifier().refusal(METHOD, proof("another-secret-0123456", METHOD, now_ms=1_000_000))


def test_no_proof_names_the_keys_to_set():
    message = verifier().refusal(METHOD, ())
    assert auth_internal.SECRET_ENV in message and "clusterSecret" in message


def test_a_proof_outside_the_window_is_refused_naming_the_setting():
    v = verifier(window_ms=1000)
    assert "clusterAuthWindowMillis" in v.refusal(METHOD, proof(SECRET, METHOD, now_ms=1_000_000 - 1001))
    assert v.refusal(METHOD, proof(SECRET, METHOD, now_ms=1_000_000 + 999)) is None


def test_the_replay_memory_is_bounded_and_refuses_a_flood_by_name():
    v = verifier(nonces_max=3)
    for _ in range(3):
        assert v.refusal(METHOD, proof(SECRET, METHOD, now_ms=1_000_000)) is None
    assert "NONCES_MAX" in v.refusal(METHOD, proof(SECRET, METHOD, now_ms=1_000_000))


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
    import asyncio

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
        signers = [lambda method: (("x-test-signed", method),)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             interceptors=auth_internal.signing_interceptors(signers)) as channel:
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
