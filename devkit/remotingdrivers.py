"""The RocketMQ 4.x clients (the Remoting protocol) as test dependencies: the Java client (rocketmq-client 4.9.8,
tests/remoting_java), the Go client (github.com/apache/rocketmq-client-go/v2, tests/remoting_go) and the C++ client (the
Node addon rocketmq-nodejs, tests/remoting_node), each driven by a small program of ours that scripts/setup.sh --tests
builds or installs. All take the same command line

    <command> --namesrv host:port [--option value | --flag]...

(commands and options: the header of tests/remoting_java/src/main/java/rocketraft/remotingjava/Driver.java; the Go
driver has send, transaction, push and pull, the C++ one send and push) and print one JSON line per event, ending with a
"summary" line. They run as devkit.sdkdrivers.SdkDriver processes ("java4", "go4", "cpp4"), so launching, reading and
stopping them is that module's; this one only turns keyword options into flags:

    events = java4("send", namesrv, topic="orders", count=20, tag="TagA", property={"color": "red"})
    run = go4.start("push", namesrv, topic="orders", group="readers", expect=20, timeout_s=30)
    ... run.wait_for("received", 20, 30) ... run.finish(60)

(`RemotingClient` bound to a test's log directory, as the fixtures of tests/remoting_clients do.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from devkit.sdkdrivers import SdkDriver

CLIENTS = ("java4", "go4", "cpp4")
WAIT_S = 90  # how long a run may take by default (`wait_s`; the drivers' own --timeout-s is `timeout_s`)


def flags(**options) -> list[str]:
    """`topic="T", count=3, tag_expr="a||b", orderly=True, property={"k": "v"}` -> `--topic T --count 3 --tag-expr a||b
    --orderly --property k=v`. None and False are left out; a list repeats its flag."""
    args: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                args += [flag, f"{k}={v}"]
        elif isinstance(value, (list, tuple)):
            for v in value:
                args += [flag, str(v)]
        else:
            args += [flag, str(value)]
    return args


class RemotingClient:
    """One 4.x client's driver for a test: `client(command, namesrv, **options)` runs it to its end (within `wait_s`)
    and returns every event it printed (a "fatal" one, or a non-zero exit, fails); `client.start(...)` returns the
    running SdkDriver. `start_driver(*args, env=...)` launches it (the fixture of tests/sdkkit.driver_fixtures, which
    stops every run at teardown), or `log_dir` names where a plain SdkDriver keeps its stderr and the client's log."""

    def __init__(self, client: str, start_driver: Callable[..., SdkDriver] | None = None, log_dir: str | None = None):
        assert client in CLIENTS, client
        assert (start_driver is None) != (log_dir is None), "either start_driver or log_dir"
        self.client = client
        self._start_driver = start_driver
        self._log_dir = log_dir

    def start(self, command: str, namesrv: str, env: dict[str, str] | None = None, **options) -> SdkDriver:
        args = (command, "--namesrv", namesrv, *flags(**options))
        if self._start_driver is not None:
            return self._start_driver(*args, env=env)
        return SdkDriver(self.client, *args, log_dir=self._log_dir, env=env)

    def __call__(self, command: str, namesrv: str, wait_s: float = WAIT_S, env: dict[str, str] | None = None,
                 **options) -> list[dict]:
        run = self.start(command, namesrv, env=env, **options)
        try:
            return run.finish(wait_s)
        finally:
            run.stop()


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def summary(events: list[dict]) -> dict:
    """The run's closing line (a run without one ended early, which `finish` already reports)."""
    found = of(events, "summary")
    assert found, f"no summary line in {events[-5:]}"
    return found[-1]
