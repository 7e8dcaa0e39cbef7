"""The NameServer's settings (namesrv/config.py): one typed object from a TOML file, then the environment, then flags,
as the broker's; a bad value or an unknown key is refused by name; the flags and variables of earlier releases are
aliases of the keys; a process started with only a file serves routes."""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from test_namesrv_process import group_of_three

from cli import main as cli_main
from devkit.localcluster import free_port
from namesrv import config as namesrv_config
from namesrv.config import NamesrvConfig
from rocketraft.protocol.wire import Code, ipb, ipb_grpc, pb, svc, svc_grpc

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 10


def parse(*argv: str, environ: dict | None = None) -> NamesrvConfig:
    parser = argparse.ArgumentParser()
    namesrv_config.add_arguments(parser)
    args = parser.parse_args(argv)
    alias_flags = {a.flag: getattr(args, f"alias_{i}") for i, a in enumerate(namesrv_config.ALIASES)}
    return namesrv_config.load(args.config, namesrv_config.KEYS.from_flags(args), environ or {}, alias_flags)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "namesrv.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_rocketmqs_port_on_loopback_with_the_remoting_door_next_to_it_and_no_metrics():
    config = namesrv_config.load(None, {}, environ={})
    assert (config.listen_address, config.remoting_address, config.metrics_address) == \
        ("127.0.0.1:9876", "127.0.0.1:9877", None)
    assert config.cluster_secret == "" and not config.guard_config.on and not config.server_tls.on


def test_the_file_is_overridden_by_the_environment_and_both_by_flags(tmp_path):
    path = write(tmp_path, 'listenPort = 9001\nbindAddress = "0.0.0.0"\nauthCacheMillis = 100\nlogLevel = "DEBUG"\n')
    from_file = parse("-c", path)
    assert (from_file.listen_address, from_file.authCacheMillis, from_file.logLevel) == ("0.0.0.0:9001", 100, "DEBUG")
    env = {"ROCKETRAFT_LISTEN_PORT": "9002", "ROCKETRAFT_AUTH_CACHE_MILLIS": "200"}
    from_env = parse("-c", path, environ=env)
    assert (from_env.listenPort, from_env.authCacheMillis, from_env.bindAddress) == (9002, 200, "0.0.0.0")
    from_flags = parse("-c", path, "--listenPort", "9003", environ=env)
    assert (from_flags.listenPort, from_flags.authCacheMillis) == (9003, 200)


def test_booleans_read_true_and_false_from_every_source(tmp_path):
    secret = {"ROCKETRAFT_CLUSTER_SECRET": "s" * 32}
    on = parse("-c", write(tmp_path, "authenticationEnabled = true\n"), "--authorizationEnabled", "true",
               environ=secret)
    assert on.authenticationEnabled is True and on.authorizationEnabled is True
    off = parse("--authenticationAnyTimezone", "off", environ={"ROCKETRAFT_CLUSTER_AUTH_LEGACY_PROOFS": "false"})
    assert off.authenticationAnyTimezone is False and off.clusterAuthLegacyProofs is False


@pytest.mark.parametrize("key, value, words", [
    ("listenPort", "many", "listenPort: 'many' is not a valid int"),
    ("listenPort", "70000", "listenPort 70000: use a port 1..65535, or 0"),
    ("authenticationEnabled", "maybe", "authenticationEnabled: 'maybe' is not a boolean"),
    ("clusterAuthWindowMillis", "0", "clusterAuthWindowMillis 0: use at least 1 (ms)"),
    ("authCacheMillis", "-1", "authCacheMillis -1: use 0 or more"),
    ("metricsListen", "9100", "metricsListen '9100': give host:port"),
    ("remotingListen", "nowhere", "remotingListen 'nowhere': give host:port"),
    ("clusterAuthAudiences", "lb.example:80;lb", "clusterAuthAudiences 'lb': give host:port"),
    ("tlsMode", "sometimes", "tlsMode"),
    ("clusterSecret", "short", "clusterSecret: the cluster secret has 5 characters"),
    ("logLevel", "LOUD", "logLevel 'LOUD': use one of DEBUG, INFO"),
])
def test_an_invalid_value_is_refused_naming_its_key(key, value, words):
    with pytest.raises(ValueError) as refused:
        parse(f"--{key}", value)
    assert words in str(refused.value)


def test_authentication_without_a_cluster_secret_is_refused():
    with pytest.raises(ValueError, match="authenticationEnabled"):
        parse("--authenticationEnabled", "true")


def test_an_unknown_key_in_the_file_is_refused_naming_it_and_the_nearest_key(tmp_path):
    with pytest.raises(ValueError) as refused:
        parse("-c", write(tmp_path, "listenPrt = 9876\n"))
    assert "unknown keys ['listenPrt']" in str(refused.value)
    assert "listenPrt: did you mean listenPort?" in str(refused.value)


def test_a_variable_that_is_a_keys_name_but_for_its_underscores_is_refused():
    with pytest.raises(ValueError, match="environment variable ROCKETRAFT_LISTENPORT: not a NameServer key's name; "
                                         "did you mean ROCKETRAFT_LISTEN_PORT"):
        parse(environ={"ROCKETRAFT_LISTENPORT": "1"})
    others = {"ROCKETRAFT_TLS": "true", "ROCKETRAFT_BROKER_NAME": "broker-b", "ROCKETRAFT_PARENT_PID": "1"}
    assert parse(environ=others).listenPort == 9876  # the broker's and the client's variables pass


def test_the_old_flags_are_aliases_of_their_keys():
    config = parse("--listen", "0.0.0.0:9100", "--remoting-listen", "off", "--metrics-listen", "127.0.0.1:9200",
                   "--cluster-auth-window-ms", "5000", "--cluster-auth-audiences", "lb.example:9876",
                   "--cluster-auth-legacy-proofs", "--authentication-window-ms", "1000",
                   "--authentication-any-timezone", "--auth-cache-ms", "0", "--tls-mode", "disabled",
                   "--tls-client-auth", "none", "--log-level", "WARNING")
    assert (config.bindAddress, config.listenPort, config.remoting_address, config.metrics_address) == \
        ("0.0.0.0", 9100, "", ("127.0.0.1", 9200))
    assert (config.clusterAuthWindowMillis, config.cluster_auth_audiences, config.clusterAuthLegacyProofs) == \
        (5000, ("lb.example:9876",), True)
    assert (config.authenticationWindowMillis, config.authenticationAnyTimezone, config.authCacheMillis) == \
        (1000, True, 0)
    assert (config.tlsMode, config.tlsClientAuth, config.logLevel) == ("disabled", "none", "WARNING")


def test_a_switch_alias_turns_its_key_on_and_the_new_flag_wins_over_the_old(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("s" * 32)
    config = parse("--cluster-secret-file", str(secret_file), "--authentication-enabled", "--authorization-enabled")
    assert config.clusterSecretFile == str(secret_file) and config.cluster_secret == "s" * 32
    assert config.authenticationEnabled and config.authorizationEnabled
    assert parse("--listen", "127.0.0.1:9100", "--listenPort", "9300").listen_address == "127.0.0.1:9300"
    with pytest.raises(ValueError, match=r"--listen '9100' \(bindAddress and listenPort\): give host:port"):
        parse("--listen", "9100")


def test_the_old_variables_are_aliases_below_the_new_ones():
    old = {"ROCKETRAFT_NAMESRV_LISTEN": "0.0.0.0:9100", "ROCKETRAFT_NAMESRV_METRICS_LISTEN": "127.0.0.1:9200",
           "ROCKETRAFT_NAMESRV_REMOTING_LISTEN": "127.0.0.1:9201"}
    config = parse(environ=old)
    assert (config.listen_address, config.metricsListen, config.remotingListen) == \
        ("0.0.0.0:9100", "127.0.0.1:9200", "127.0.0.1:9201")
    assert parse(environ=dict(old, ROCKETRAFT_LISTEN_PORT="9300")).listen_address == "0.0.0.0:9300"


def test_help_lists_every_key_with_its_variable(capsys):
    with pytest.raises(SystemExit):
        cli_main.main(["namesrv", "--help"])
    shown = capsys.readouterr().out
    for key in namesrv_config.KEYS.names:
        assert f"--{key}" in shown, f"rocketraft namesrv --help does not show {key}"
    assert "ROCKETRAFT_LISTEN_PORT" in shown and "formerly --tls-mode" in shown
    direct = subprocess.run([sys.executable, "-m", "namesrv", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert direct.returncode == 0 and all(f"--{key}" in direct.stdout for key in namesrv_config.KEYS.names)


def test_a_process_started_with_a_config_file_serves_routes(tmp_path):
    port = free_port("127.0.0.1")
    path = write(tmp_path, f'bindAddress = "127.0.0.1"\nlistenPort = {port}\nremotingListen = "off"\n'
                           'logLevel = "DEBUG"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETRAFT_")}
    log_path = tmp_path / "namesrv.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "namesrv", "-c", path], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        assert line == f"namesrv listening on 127.0.0.1:{port}\n", f"got {line!r}: {log_path.read_text()}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for registration in group_of_three("broker-a"):
                ipb_grpc.NameServerStub(channel).RegisterBroker(
                    ipb.RegisterBrokerRequest(registration=registration), timeout=5)
            reply = svc_grpc.MessagingServiceStub(channel).QueryRoute(
                svc.QueryRouteRequest(topic=pb.Resource(name="T")), timeout=5)
        assert reply.status.code == Code.OK and {q.broker.name for q in reply.message_queues} == {"broker-a"}
        assert "heartbeat from replica" in log_path.read_text() or "registered" in log_path.read_text()
        assert "Remoting door" not in log_path.read_text(), "remotingListen = off in the file closes it"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log_path.read_text()
