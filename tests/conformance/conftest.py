"""The conformance suite's fixtures: `target`, one rocketraft DevCluster and one Apache RocketMQ reference
(conformancekit), each started once per module and set up with the same topics and groups; a test runs once per
target (ids "rocketraft" and "reference"). pytest orders a module's tests by target: the rocketraft tests run
first, while the reference starts in the background (it takes 25-85 s), and the rocketraft cluster stops before the
reference tests begin.

A test whose rocketraft run differs from the reference is marked for that id only: `@differs("<the difference>")`
(conformancekit; xfail, strict: it must fail on rocketraft, and pass on the reference)."""

from __future__ import annotations

import threading

import pytest
from conformancekit import TARGETS, Target, require_reference, start_reference, start_rocketraft, stop
from sdkkit import checked_driver

from devkit import reference
from devkit.nodesdk import MISSING as NODE_MISSING
from devkit.nodesdk import NodeScript
from devkit.nodesdk import installed as node_installed

_PRESTART = pytest.StashKey[dict]()


class _Prestart:
    """The reference's start (about 25 s, much more on a busy machine, and its topics and groups made one mqadmin
    command at a time) in a thread while the module's rocketraft tests run; stopped at the end of the session if no
    test took it."""

    def __init__(self, base_dir: str):
        self.result: Target | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(base_dir,), name="reference-start", daemon=True)
        self._thread.start()

    def _run(self, base_dir: str) -> None:
        try:
            self.result = start_reference(base_dir)
        except BaseException as exc:  # noqa: BLE001 - raised again in the test that takes it
            self.error = exc

    def take(self) -> Target:
        self._thread.join()
        if self.error is not None:
            raise self.error
        result, self.result = self.result, None
        return result

    def discard(self) -> None:
        self._thread.join()
        if self.result is not None:
            stop(self.result)


def _wants_reference(request) -> bool:
    return reference.available() and any(
        getattr(item, "callspec", None) is not None and item.callspec.params.get("target") == "reference"
        and item.module is request.module for item in request.session.items)


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tmp_path_factory):
    prestarted = request.config.stash.setdefault(_PRESTART, {})
    module = request.module.__name__
    if request.param == "rocketraft":
        started = start_rocketraft(str(tmp_path_factory.mktemp("rocketraft")))
        if _wants_reference(request) and module not in prestarted:
            prestarted[module] = _Prestart(str(tmp_path_factory.mktemp("reference")))
            request.config.add_cleanup(prestarted[module].discard)
    else:
        require_reference()
        prestart = prestarted.pop(module, None)
        started = prestart.take() if prestart is not None else start_reference(
            str(tmp_path_factory.mktemp("reference")))
    yield started
    stop(started)


@pytest.fixture(scope="module")
def runs():
    """Scenario runs kept for the module: several tests assert on one run per target (each SDK process is slow
    to start on a 2-core machine), keyed by (target name, scenario)."""
    return {}


java = checked_driver("java")
go = checked_driver("go")


@pytest.fixture
def node(tmp_path):
    """Starts the Node.js SDK's scripts (tests/sdk_node); skips where it is not installed, fails under CI."""
    import os

    if not node_installed():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node.js SDK tests: {NODE_MISSING}")
        pytest.skip(NODE_MISSING)
    started: list[NodeScript] = []

    def start(script: str, *args: str) -> NodeScript:
        started.append(NodeScript(script, *args, log_dir=str(tmp_path)))
        return started[-1]

    yield start
    for script in reversed(started):
        script.stop()
