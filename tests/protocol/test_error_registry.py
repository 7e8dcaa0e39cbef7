"""The error registry (rocketraft/protocol/errors.py, REGISTRY): one entry per code, from which the client's classes,
its retry decisions, the Remoting door's answers and docs/errors.md come. No code is invented at a raise site."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from rocketraft.client import consumer, producer
from rocketraft.protocol import errors
from rocketraft.protocol.errors import (
    REGISTRY,
    BadRequestError,
    BrokerUnreachableError,
    IllegalFilterExpressionError,
    NotMasterError,
    OutcomeUnknownError,
    Retry,
    RocketraftCode,
    RocketraftError,
    TopicNotFoundError,
    error_for,
    from_status,
    retry_of,
)
from rocketraft.protocol.wire import Code, pb
from rocketraft.remoting.codes import Response, response_of

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("dledger", "broker", "namesrv", "serverkit", "dashboard", "cli", "rocketraft")


def library_files() -> list[Path]:
    return [p for top in LIBRARY for p in sorted((ROOT / top).rglob("*.py"))
            if "__pycache__" not in p.parts and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def error_classes() -> dict[str, type[RocketraftError]]:
    """Every RocketraftError subclass the library defines, by name (each library module imported)."""
    found: dict[str, type[RocketraftError]] = {}
    for path in library_files():
        relative = path.relative_to(ROOT).with_suffix("")
        if relative.name in ("__main__", "splicer_child", "_storecheck_child"):
            continue
        module = importlib.import_module(".".join(relative.parts).removesuffix(".__init__"))
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, RocketraftError):
                assert found.get(name, value) is value, f"two error classes are named {name}"
                found[name] = value
    return found


def test_each_code_has_one_entry_and_every_entry_a_cause_users_can_read():
    codes = [e.code for e in REGISTRY]
    assert len(codes) == len(set(codes)), "a code registered twice"
    terse = [e.code for e in REGISTRY if len(e.cause.split()) < 4]
    assert not terse, f"codes whose cause is not a phrase users can act on: {terse}"
    assert {c.value for c in RocketraftCode} <= set(codes), "every rocketraft code is in the registry"


def test_every_error_class_carries_a_code_the_registry_gives_it_or_one_of_its_ancestors():
    stray = {name: cls.code for name, cls in error_classes().items()
             if errors.entry_of(cls.code) is None or not issubclass(cls, errors.entry_of(cls.code).error)}
    assert not stray, f"error classes whose code the registry does not give them: {stray}"


def test_a_code_outside_a_class_family_is_refused_when_the_error_is_made():
    assert BadRequestError("m", Code.ILLEGAL_TOPIC).code == Code.ILLEGAL_TOPIC
    with pytest.raises(ValueError, match="RocketraftError cannot carry code 40300"):
        RocketraftError("m", Code.FORBIDDEN)
    with pytest.raises(ValueError, match="BadRequestError cannot carry code 40010"):
        BadRequestError("m", Code.ILLEGAL_FILTER_EXPRESSION)  # that cause has its own class
    assert IllegalFilterExpressionError("m").code == Code.ILLEGAL_FILTER_EXPRESSION


def _literal_code(node: ast.AST) -> int | None:
    """The value of `Code.X` / `RocketraftCode.X` / `pb.Code.X`, None for anything else."""
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("Code", "pb.Code", "RocketraftCode"):
        enum = RocketraftCode if ast.unparse(node.value) == "RocketraftCode" else Code
        return int(getattr(enum, node.attr))
    return None


def ad_hoc_codes(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Raise sites that give an error a code its class may not carry, or give the base class any code."""
    classes = error_classes()
    found = []
    for path in paths:
        relative = path.relative_to(root).as_posix()
        if relative == "rocketraft/protocol/errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            code_arg = node.args[1] if len(node.args) >= 2 else next(
                (k.value for k in node.keywords if k.arg == "code"), None)
            if name == "ApplyError" and node.args:  # the state machine's refusal: error_for turns its code back
                code = _literal_code(node.args[0])
                if code is not None and errors.entry_of(code) is None:
                    found.append(f"{relative}:{node.lineno} ApplyError with unregistered code {code}")
                continue
            cls = classes.get(name)
            if cls is None or code_arg is None:
                continue
            if cls is RocketraftError:
                found.append(f"{relative}:{node.lineno} RocketraftError given a code: raise the cause's class")
                continue
            code = _literal_code(code_arg)
            if code is not None and not errors._registered_for(cls, code):
                found.append(f"{relative}:{node.lineno} {name} given code {code}, which the registry does not give it")
    return found


def test_no_raise_site_invents_a_code():
    found = ad_hoc_codes(library_files())
    assert not found, "ad-hoc codes (add the cause to REGISTRY, or raise its class):\n" + "\n".join(found)


def test_the_scan_sees_an_ad_hoc_code(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("from rocketraft.protocol.errors import RocketraftError, BadRequestError\n"
                   "from rocketraft.protocol.wire import Code\n"
                   "def f():\n    raise RocketraftError('x', Code.FORBIDDEN)\n"
                   "def g():\n    raise BadRequestError('x', Code.HA_NOT_AVAILABLE)\n")
    found = ad_hoc_codes([bad], tmp_path)
    assert found == ["probe.py:4 RocketraftError given a code: raise the cause's class",
                     "probe.py:6 BadRequestError given code 50002, which the registry does not give it"], found


@pytest.mark.parametrize("entry", REGISTRY, ids=lambda e: errors._name(e.code))
def test_a_status_comes_back_as_its_registered_class_with_its_code(entry):
    received = from_status(pb.Status(code=entry.code, message="the server's words"))
    assert isinstance(received, entry.error) and received.code == entry.code
    assert received.message == "the server's words"
    assert retry_of(received) is entry.retry


def test_a_code_no_entry_knows_is_kept_as_sent():
    assert from_status(pb.Status(code=Code.CLIENT_ID_REQUIRED, message="m")).code == Code.CLIENT_ID_REQUIRED
    assert isinstance(error_for(Code.CLIENT_ID_REQUIRED, "m"), BadRequestError)
    assert retry_of(error_for(99_999, "m")) is Retry.NO


@pytest.mark.parametrize("entry", REGISTRY, ids=lambda e: errors._name(e.code))
def test_the_clients_retry_decisions_are_the_registrys(entry):
    error = error_for(entry.code, "m")
    expected = {Retry.NO: "fatal", Retry.ELSEWHERE: "elsewhere", Retry.UNKNOWN: "unknown"}[entry.retry]
    if isinstance(error, TopicNotFoundError):
        expected = "elsewhere"  # the producer's routing rule: another group may have the topic
    assert producer.classify(error) == expected
    assert consumer.retryable(error) is (entry.retry is not Retry.NO)


def test_a_connection_never_made_is_elsewhere_and_one_broken_after_sending_is_unknown():
    assert retry_of(BrokerUnreachableError("m", "a:1", sent=False)) is Retry.ELSEWHERE
    assert retry_of(BrokerUnreachableError("m", "a:1", sent=True)) is Retry.UNKNOWN
    assert retry_of(ValueError("a defect")) is Retry.NO


@pytest.mark.parametrize("entry", [e for e in REGISTRY if e.retry is Retry.ELSEWHERE],
                         ids=lambda e: errors._name(e.code))
def test_the_remoting_door_answers_every_cause_another_try_cures_so_a_4x_producer_retries(entry):
    assert response_of(entry.code, send=True) is Response.SERVICE_NOT_AVAILABLE


def test_each_cause_has_its_own_class():
    assert type(error_for(Code.HA_NOT_AVAILABLE, "m")) is NotMasterError
    assert type(error_for(Code.PROXY_TIMEOUT, "m")) is OutcomeUnknownError


def test_docs_errors_md_is_the_registry():
    text = (ROOT / "docs" / "errors.md").read_text()
    begin, end = "<!-- registry: begin -->\n", "<!-- registry: end -->"
    table = text[text.index(begin) + len(begin):text.index(end)]
    assert table == errors.markdown_table(), ("docs/errors.md differs from the registry: regenerate its table with "
                                              "`python -m rocketraft.protocol.errors`")
