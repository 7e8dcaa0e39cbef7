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
