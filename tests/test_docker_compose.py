"""docker/docker-compose.yml and docker/Dockerfile: checked without an engine, then run on a real Docker engine.

The first tests need no engine: every service's `command:` is run through the real `rocketraft` CLI
(cli.main.main, with the server's `run` replaced by a hook that keeps the parsed arguments), each server's
arguments go through its config's from_args (broker.config, namesrv.config), and the resulting settings are checked
against the compose file's ports, volumes and service names; `config -q` runs with every Compose installed (v2 and
v1). The last test starts the cluster as docker/README.md says wherever a Docker engine answers (scripts/setup.sh
--tests installs and starts one as root), and skips, saying why, only where none does."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "docker-compose.yml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"

NAMESRV = "namesrv"
BROKERS = ("broker-n0", "broker-n1", "broker-n2")
CLUSTER, GROUP = "DefaultCluster", "broker-a"
RAFT_PORT = 40911
DATA_DIR = "/data"
ADVERTISED_HOST_DEFAULT = "localhost"  # what the official SDK on the docker host connects to
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}
SECRET_NAME = "cluster-secret"
SECRET_IN_CONTAINER = f"/run/secrets/{SECRET_NAME}"  # where Compose mounts the secret file
TEST_SECRET = "compose-test-cluster-secret-0123456789"


# -- compose file ------------------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
                       r"|(?P<bare>[A-Za-z_]\w*))")


def _interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation (${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, $$) on values."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        name = m["braced"] or m["bare"]
        op, arg = m["op"] or "", m["arg"] or ""
        present = name in env and (env[name] != "" or not op.startswith(":"))
        if op.endswith("-"):
            return env[name] if present else arg
        if op.endswith("?"):
            if not present:
                pytest.fail(f"{COMPOSE_FILE.name}: ${{{name}}} is required ({arg}); give it a default")
            return env[name]
        if op.endswith("+"):
            return arg if present else ""
        return env.get(name, "")

    return _VARIABLE.sub(substitute, value)


def load_compose(env: dict[str, str] | None = None) -> dict:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    with open(COMPOSE_FILE) as f:
        data = yaml.safe_load(f)  # resolves the file's anchors and << merge keys, as Compose does
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), f"{COMPOSE_FILE}: no services mapping"
    return _interpolate(data, env or {})


def command_of(service: dict, name: str) -> list[str]:
    command = service.get("command")
    assert command, f"service {name}: no command (the image's default command only prints --help)"
    if isinstance(command, str):  # Compose splits a string command like a shell would
        return shlex.split(command)
    return [str(arg) for arg in command]


def published_ports(service: dict, name: str) -> list[tuple[int, int]]:
    """(host port, container port) for every published port of a service."""
    out = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):  # long syntax
            assert "published" in entry, f"service {name}: port {entry} publishes no host port"
            out.append((int(entry["published"]), int(entry["target"])))
            continue
        spec = str(entry).split("/")[0]
        parts = spec.rsplit(":", 2)
        assert len(parts) >= 2, f"service {name}: port {entry!r} publishes no fixed host port (clients need one)"
        assert all(p.isdigit() for p in parts[-2:]), f"service {name}: port {entry!r}: use single ports, not ranges"
        out.append((int(parts[-2]), int(parts[-1])))
    return out


def named_volumes(service: dict, name: str) -> dict[str, str]:
    """Mount target -> named volume, for the service's named-volume mounts (bind mounts are left out)."""
    out = {}
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            if entry.get("type", "volume") == "volume" and entry.get("source"):
                out[entry["target"]] = entry["source"]
            continue
        source, sep, rest = str(entry).partition(":")
        if sep and not source.startswith(("/", ".", "~", "$")):
            out[rest.split(":")[0]] = source
    return out


def split_host_port(address: str, what: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    assert sep and host and port.isdigit(), f"{what} {address!r} is not host:port"
    return host, int(port)


def is_under(path: str, directory: str) -> bool:
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


# -- the real CLI ------------------------------------------------------------------------------------------------

# Runs in a fresh interpreter in the repo root: under pytest, tests/ is on sys.path and its dledger/ and broker/
# directories (no __init__.py) would shadow the real packages, which broker.server needs whole. The script runs
# cli.main.main exactly as the image's ENTRYPOINT would, with the servers' `run` replaced by a hook that
# keeps the parsed arguments, and turns each server's arguments into its config (broker.config.from_args,
# namesrv.config.from_args).
_PARSE_SCRIPT = """
import contextlib, dataclasses, io, json, logging, sys
from broker import config as broker_config, server as broker_server
from namesrv import config as namesrv_config, server as namesrv_server
from cli import main as cli

captured = []
broker_server.run = namesrv_server.run = lambda args: captured.append(args) or 0
logging.basicConfig = lambda *a, **k: None
out = {}
for name, argv in json.load(sys.stdin).items():
    captured.clear()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(argv)
    except SystemExit as e:
        out[name] = {"error": f"the rocketraft CLI refuses it (exit {e.code}): {err.getvalue().strip()}"}
        continue
    if rc != 0 or len(captured) != 1:
        out[name] = {"error": "cli.main.main did not reach broker.server.run / namesrv.server.run; it "
                              "dispatches differently now: update _PARSE_SCRIPT in this test"}
        continue
    args = captured[0]
    server = "broker" if argv[0] == "broker" else "NameServer"
    try:
        cfg = (broker_config if argv[0] == "broker" else namesrv_config).from_args(args)
    except (ValueError, OSError) as e:
        out[name] = {"error": f"the {server} would refuse to start: {e}"}
        continue
    derived = (dict(peers=cfg.peers, namesrv_addresses=cfg.namesrv_addresses) if argv[0] == "broker"
               else dict(listen_address=cfg.listen_address))
    out[name] = {"config": dict(dataclasses.asdict(cfg), **derived)}
print(json.dumps(out))
"""


def parse_with_cli(commands: dict[str, list[str]], secret_file: str) -> dict[str, dict]:
    """Service name -> {"config": BrokerConfig fields + peers, namesrv_addresses, or NamesrvConfig fields +
    listen_address}.
    The secret's path in the container is read as `secret_file` here (the broker reads the file to validate it)."""
    commands = {name: [secret_file if a == SECRET_IN_CONTAINER else a for a in argv] for name, argv in commands.items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETRAFT_")}  # the containers set none
    proc = subprocess.run([sys.executable, "-c", _PARSE_SCRIPT], input=json.dumps(commands), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"parsing the compose commands with cli.main crashed:\n{proc.stderr}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, result in results.items():
        assert "error" not in result, f"service {name}: `rocketraft {shlex.join(commands[name])}`: {result['error']}"
    return results


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


# Compose variables set for the "overridden" variant: the file must use them where the README says.
OVERRIDES = {"ROCKETRAFT_ADVERTISED_HOST": "192.0.2.7", "ROCKETRAFT_SUBNET_PREFIX": "10.9.8",
             "ROCKETRAFT_PUBLISH_HOST": "192.0.2.7"}


@pytest.fixture(scope="module")
def variants() -> dict[str, dict[str, dict]]:
    """Services of the compose file as Compose would see them, with no variables set and with OVERRIDES."""
    return {"default": load_compose()["services"], "overridden": load_compose(OVERRIDES)["services"]}


@pytest.fixture(scope="module")
def parsed_variants(variants, tmp_path_factory) -> dict[str, tuple[SimpleNamespace, dict[str, SimpleNamespace]]]:
    """Per variant: (the NamesrvConfig, broker service -> its BrokerConfig), from one run of the CLI."""
    commands = {}
    for variant, services in variants.items():
        for name in (NAMESRV, *BROKERS):
            assert name in services, f"{COMPOSE_FILE.name} has no service {name!r} (services: {sorted(services)})"
            command = command_of(services[name], name)
            expected = "namesrv" if name == NAMESRV else "broker"
            assert command[0] == expected, f"service {name}: command must start with `{expected}`, not {command[0]!r}"
            commands[f"{name} ({variant} variables)"] = command
    secret_file = tmp_path_factory.mktemp("secret") / SECRET_NAME
    secret_file.write_text(TEST_SECRET)
    results = parse_with_cli(commands, str(secret_file))
    return {variant: (SimpleNamespace(**results[f"{NAMESRV} ({variant} variables)"]["config"]),
                      {n: SimpleNamespace(**results[f"{n} ({variant} variables)"]["config"]) for n in BROKERS})
            for variant in variants}


@pytest.fixture(scope="module")
def namesrv_config(parsed_variants) -> SimpleNamespace:
    return parsed_variants["default"][0]


@pytest.fixture(scope="module")
def configs(parsed_variants) -> dict[str, SimpleNamespace]:
    return parsed_variants["default"][1]


# -- compose: services and commands ------------------------------------------------------------------------------

def test_services_exist_and_brokers_are_exactly_the_group(services):
    missing = [n for n in (NAMESRV, *BROKERS) if n not in services]
    assert not missing, f"{COMPOSE_FILE.name} lacks services {missing} (has {sorted(services)})"
    running_broker = sorted(n for n, s in services.items() if command_of(s, n)[0] == "broker")
    assert running_broker == sorted(BROKERS), f"services running `broker`: {running_broker}, expected {BROKERS}"


def test_every_service_runs_the_image_built_from_docker_dockerfile(services):
    images = {}
    for name in (NAMESRV, *BROKERS):
        build = services[name].get("build")
        assert isinstance(build, dict), f"service {name}: needs a build section (context + dockerfile)"
        context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
        assert context == ROOT, f"service {name}: build context {build.get('context')!r} is {context}, not the repo"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.resolve() == DOCKERFILE.resolve(), f"service {name}: dockerfile {dockerfile} != {DOCKERFILE}"
        images[name] = services[name].get("image")
    assert len(set(images.values())) == 1 and None not in images.values(), (
        f"every service should tag and run one image, got {images}")


def test_configuration_is_in_the_commands_not_the_environment(services):
    for name in (NAMESRV, *BROKERS):
        service = services[name]
        assert "env_file" not in service, f"service {name}: env_file would hide settings from this test"
        env = service.get("environment") or {}
        keys = [e.split("=")[0] for e in env] if isinstance(env, list) else list(env)
        hidden = [k for k in keys if k.startswith("ROCKETRAFT_")]
        assert not hidden, f"service {name}: set {hidden} as `command:` flags instead, so the command is the config"


def test_namesrv_listens_on_a_published_port(services, namesrv_config):
    host, port = split_host_port(namesrv_config.listen_address, "namesrv bindAddress:listenPort")
    assert host not in LOOPBACK_HOSTS, f"namesrv bindAddress {host}: loopback is unreachable from " \
                                       f"other containers and published ports; listen on 0.0.0.0"
    container_ports = [c for _, c in published_ports(services[NAMESRV], NAMESRV)]
    assert port in container_ports, f"namesrv listens on {port} but publishes {container_ports}"


def test_brokers_form_one_group_of_the_cluster(configs):
    for name, cfg in configs.items():
        assert cfg.brokerName == GROUP, f"service {name}: brokerName {cfg.brokerName!r}, expected {GROUP!r}"
        assert cfg.brokerClusterName == CLUSTER, f"service {name}: brokerClusterName {cfg.brokerClusterName!r}"
    self_ids = {name: cfg.dLegerSelfId for name, cfg in configs.items()}
    assert len(set(self_ids.values())) == len(BROKERS), f"dLegerSelfId must differ per replica: {self_ids}"


def test_dleger_peers_are_the_three_broker_services_on_the_raft_port(configs):
    peer_lists = {name: cfg.dLegerPeers for name, cfg in configs.items()}
    assert len(set(peer_lists.values())) == 1, f"every replica must list the same dLegerPeers: {peer_lists}"
    for name, cfg in configs.items():
        peers = cfg.peers
        assert cfg.dLegerSelfId in peers, f"service {name}: dLegerSelfId {cfg.dLegerSelfId} not in {cfg.dLegerPeers}"
        hosts = sorted(split_host_port(a, f"{name} dLegerPeers item")[0] for a in peers.values())
        assert hosts == sorted(BROKERS), f"service {name}: dLegerPeers hosts {hosts} must be the services {BROKERS}"
        ports = {split_host_port(a, "dLegerPeers item")[1] for a in peers.values()}
        assert ports == {RAFT_PORT}, f"service {name}: Raft ports {ports}, expected {RAFT_PORT}"
        own_host = split_host_port(peers[cfg.dLegerSelfId], "own Raft address")[0]
        assert own_host == name, (f"service {name}: its own Raft address {peers[cfg.dLegerSelfId]} names {own_host}; "
                                  f"the replica binds it, so it must be this container's service name")


def test_brokers_register_with_the_namesrv_service(configs, namesrv_config):
    _, namesrv_port = split_host_port(namesrv_config.listen_address, "namesrv bindAddress:listenPort")
    for name, cfg in configs.items():
        assert cfg.namesrv_addresses, f"service {name}: namesrvAddr is empty"
        for address in cfg.namesrv_addresses:
            host, port = split_host_port(address, f"{name} namesrvAddr")
            assert (host, port) == (NAMESRV, namesrv_port), (
                f"service {name}: namesrvAddr {address} should be {NAMESRV}:{namesrv_port} (the compose service)")


def test_broker_ports_are_published_and_advertised(services, configs):
    host_ports = {}
    for name in (NAMESRV, *BROKERS):
        for host_port, _ in published_ports(services[name], name):
            assert host_port not in host_ports, f"host port {host_port} published by {host_ports[host_port]} and {name}"
            host_ports[host_port] = name
    for name, cfg in configs.items():
        listen_host, listen_port = split_host_port(cfg.listenAddress, f"{name} listenAddress")
        assert listen_host not in LOOPBACK_HOSTS, f"service {name}: listenAddress {cfg.listenAddress} is loopback; " \
                                                  f"a published port cannot reach it (use 0.0.0.0)"
        mapping = {container: host for host, container in published_ports(services[name], name)}
        assert listen_port in mapping, f"service {name}: listenAddress port {listen_port} is not published ({mapping})"
        assert cfg.advertisedAddress, f"service {name}: set advertisedAddress (clients cannot reach the listen address)"
        adv_host, adv_port = split_host_port(cfg.advertisedAddress, f"{name} advertisedAddress")
        assert adv_port == mapping[listen_port], (
            f"service {name}: advertisedAddress {cfg.advertisedAddress} must name the host port {mapping[listen_port]} "
            f"published for the listen port {listen_port}")
        assert adv_host == ADVERTISED_HOST_DEFAULT, (
            f"service {name}: advertisedAddress host {adv_host!r}; by default clients on the docker host are "
            f"told {ADVERTISED_HOST_DEFAULT}")
        assert cfg.internalAddress == f"{name}:{listen_port}", (
            f"service {name}: internalAddress {cfg.internalAddress!r}; the NameServer must dial {name}:{listen_port} "
            f"(inside its container {cfg.advertisedAddress} is not this broker)")


def test_broker_stores_live_on_their_own_named_volumes(compose, services, configs):
    used = {}
    for name, cfg in configs.items():
        mounts = named_volumes(services[name], name)
        targets = [t for t in mounts if is_under(cfg.storePathRootDir, t)]
        assert targets, (f"service {name}: storePathRootDir {cfg.storePathRootDir} is not inside a named volume "
                         f"(mounts: {mounts}); the store would be lost with the container")
        volume = mounts[max(targets, key=len)]
        assert volume not in used, f"services {used.get(volume)} and {name} share the volume {volume!r}"
        used[volume] = name
        assert is_under(cfg.storePathRootDir, DATA_DIR), f"service {name}: store outside {DATA_DIR} (the image VOLUME)"


def test_every_named_volume_is_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for target, volume in named_volumes(service, name).items():
            assert volume in declared, f"service {name}: volume {volume!r} (at {target}) is not declared in `volumes:`"


def test_brokers_restart_and_start_after_the_namesrv(services):
    for name in BROKERS:
        service = services[name]
        assert service.get("restart") == "unless-stopped", (
            f"service {name}: restart is {service.get('restart')!r}; a crashed replica must come back (unless-stopped)")
        depends = service.get("depends_on") or []
        assert NAMESRV in depends, f"service {name}: depends_on {depends} lacks {NAMESRV}"


def test_fixed_addresses_lie_in_their_networks(compose, services):
    subnets = {}
    for net_name, net in (compose.get("networks") or {}).items():
        for pool in ((net or {}).get("ipam") or {}).get("config") or []:
            subnets.setdefault(net_name, []).append(ipaddress.ip_network(pool["subnet"]))
    seen = {}
    for name, service in services.items():
        networks = service.get("networks") or {}
        if not isinstance(networks, dict):
            continue
        for net_name, attached in networks.items():
            address = (attached or {}).get("ipv4_address")
            if not address:
                continue
            ip = ipaddress.ip_address(address)
            assert any(ip in s for s in subnets.get(net_name, [])), (
                f"service {name}: ipv4_address {ip} is outside network {net_name!r} subnets {subnets.get(net_name)}")
            assert ip not in seen, f"services {seen.get(ip)} and {name} share {ip}"
            seen[ip] = name


def test_variables_change_the_advertised_host_and_the_subnet(variants, parsed_variants):
    host, prefix = OVERRIDES["ROCKETRAFT_ADVERTISED_HOST"], OVERRIDES["ROCKETRAFT_SUBNET_PREFIX"]
    for name, cfg in parsed_variants["overridden"][1].items():
        assert cfg.advertisedAddress.startswith(f"{host}:"), (
            f"service {name}: advertisedAddress {cfg.advertisedAddress} ignores ROCKETRAFT_ADVERTISED_HOST={host}")
    for name, service in variants["overridden"].items():
        for entry in service.get("ports") or []:
            assert str(entry).startswith(f"{host}:"), f"service {name}: port {entry} ignores ROCKETRAFT_PUBLISH_HOST"
        for attached in (service.get("networks") or {}).values():
            if (attached or {}).get("ipv4_address"):
                assert attached["ipv4_address"].startswith(f"{prefix}."), (
                    f"service {name}: {attached['ipv4_address']} ignores ROCKETRAFT_SUBNET_PREFIX={prefix}")


def test_ports_are_published_on_127_0_0_1_only(services):
    for name, service in services.items():
        for entry in service.get("ports") or []:
            host_ip = entry.get("host_ip", "") if isinstance(entry, dict) else \
                (str(entry).split("/")[0].rsplit(":", 2)[0] if str(entry).count(":") == 2 else "")
            assert host_ip == "127.0.0.1", (f"service {name}: port {entry!r} is published on every host interface; "
                                            f"publish it on 127.0.0.1 only (\"127.0.0.1:HOST:CONTAINER\")")


def test_acl_2_is_on_everywhere_with_the_cluster_secret_from_a_compose_secret(compose, services, configs,
                                                                             namesrv_config):
    declared = (compose.get("secrets") or {}).get(SECRET_NAME) or {}
    assert declared.get("file"), f"{COMPOSE_FILE.name}: declare the secret {SECRET_NAME!r} with a file"
    for name in (NAMESRV, *BROKERS):
        assert SECRET_NAME in (services[name].get("secrets") or []), f"service {name}: mount the {SECRET_NAME} secret"
    for name, cfg in configs.items():
        assert cfg.authenticationEnabled and cfg.authorizationEnabled, f"service {name}: turn ACL 2.0 on"
        assert cfg.clusterSecretFile.endswith(SECRET_NAME) and not cfg.clusterSecret, (
            f"service {name}: read the cluster secret from {SECRET_IN_CONTAINER}, never from the command line")
    assert namesrv_config.authenticationEnabled and namesrv_config.authorizationEnabled, "namesrv: turn ACL 2.0 on"
    assert namesrv_config.clusterSecretFile.endswith(SECRET_NAME) and not namesrv_config.clusterSecret, (
        f"namesrv: read the cluster secret from {SECRET_IN_CONTAINER}, never from the command line")


# -- Dockerfile --------------------------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        instruction, _, rest = (pending + stripped).partition(" ")
        out.append((instruction.upper(), rest.strip()))
        pending = ""
    return out


def _args(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def test_dockerfile_base_user_volume_and_ports(services):
    instructions = dockerfile_instructions()
    froms = [rest for ins, rest in instructions if ins == "FROM"]
    args = dict(rest.partition("=")[::2] for ins, rest in instructions if ins == "ARG" and "=" in rest)
    assert froms and froms[0].split()[0] == "${BASE_IMAGE}", f"FROM {froms}: expected FROM ${{BASE_IMAGE}}"
    assert args.get("BASE_IMAGE") == "python:3.11-slim", f"ARG BASE_IMAGE default {args.get('BASE_IMAGE')!r}"
    users = [rest for ins, rest in instructions if ins == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"the image must run as a non-root USER: {users}"
    volumes = [v for ins, rest in instructions if ins == "VOLUME" for v in _args(rest)]
    assert DATA_DIR in volumes, f"VOLUME {volumes} lacks {DATA_DIR}"
    exposed = {int(p.split("/")[0]) for ins, rest in instructions if ins == "EXPOSE" for p in rest.split()}
    assert {9876, 8081, RAFT_PORT} <= exposed, f"EXPOSE {sorted(exposed)} lacks some of 9876 8081 {RAFT_PORT}"
    for name in (NAMESRV, *BROKERS):
        for _, container_port in published_ports(services[name], name):
            assert container_port in exposed, f"service {name} publishes {container_port}, which the image lacks"


def test_dockerfile_entrypoint_is_the_rocketraft_console_script():
    entrypoints = [rest for ins, rest in dockerfile_instructions() if ins == "ENTRYPOINT"]
    assert entrypoints, "the Dockerfile has no ENTRYPOINT"
    assert json.loads(entrypoints[-1]) == ["rocketraft"], f"ENTRYPOINT {entrypoints[-1]}: expected [\"rocketraft\"]"
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"].get("scripts", {})
    assert scripts.get("rocketraft") == "cli.main:main", f"pyproject's rocketraft script is {scripts}"


def test_dockerfile_copies_exist_and_cover_every_package():
    copied = []
    for ins, rest in dockerfile_instructions():
        if ins not in ("COPY", "ADD"):
            continue
        args = _args(rest)
        if any(a.startswith("--from") for a in args):
            continue
        sources = [a for a in args if not a.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile {ins} {source}: no such file or directory in the repo"
        copied += [os.path.normpath(s) for s in sources]
    with open(ROOT / "pyproject.toml", "rb") as f:
        pyproject = tomllib.load(f)
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    missing = [p for p in packages if p not in copied]
    assert not missing, f"pyproject packages {missing} are not COPYed into the image; `pip install .` would miss them"
    for needed in ("pyproject.toml", pyproject["project"]["readme"]):
        assert needed in copied, f"the Dockerfile must COPY {needed} (pip install . reads it)"


# -- docker compose itself (no engine needed) --------------------------------------------------------------------

def _compose_cli() -> list[str] | None:
    """`docker compose` (v2) if it works here (v1, `docker-compose`, is tried too where installed)."""
    if not shutil.which("docker"):
        return None
    try:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ["docker", "compose"] if probe.returncode == 0 else None


def test_docker_compose_config_accepts_the_file(tmp_path):
    clis = [c for c in (_compose_cli(), ["docker-compose"] if shutil.which("docker-compose") else None) if c]
    if not clis:
        pytest.skip("no Docker Compose on this machine (neither `docker compose` nor `docker-compose`)")
    for compose_cli in clis:  # v2 and v1 both, where both are installed
        result = subprocess.run([*compose_cli, "-p", "rocketraft", "-f", str(COMPOSE_FILE), "config", "-q"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (
            f"`{' '.join(compose_cli)} config -q` rejects {COMPOSE_FILE.name}:\n{result.stderr}")


# -- the cluster itself, on a real Docker engine -----------------------------------------------------------------
# Follows docker/README.md: make the cluster secret, `up --build`, make app.key and the user `app`, run the README's
# official-SDK snippet as it is written, then our client as that ACL user; kill the master under load, start it
# again, `down` + `up` (with the README's recipe for clients on other machines) and check that every message, the
# user and the consumer offset are still there. Its own project name and subnet; ports are the README's, on
# 127.0.0.1, and on LAN_STANDIN_HOST, a loopback address standing in for a LAN IP (the test sends nothing off the
# machine: only to 127.0.0.0/8 and to the compose network it makes). `down -v` always runs at the end.

TEST_PROJECT = "rocketraft-composetest"
TEST_SUBNET_PREFIX = "10.251.231"
LAN_STANDIN_HOST = "127.0.0.231"
LOCAL_BASE_IMAGE = "rocketraft-base:bookworm"  # what scripts/docker-base.sh makes
HOST_PORTS = (9876, 8081, 8082, 8083)
UP_TIMEOUT_S = 900  # a first build on a fresh machine: the base image, then pip installing the project
MASTER_WAIT_S = 60
LOAD_BEFORE_KILL_S, LOAD_AFTER_KILL_S = 3.0, 6.0
SEND_INTERVAL_S = 0.05
AFTER_RESTART_MESSAGES = 10


def _any_compose_cli() -> list[str] | None:
    """Compose v2 (`docker compose`) where it works, else Compose v1 (`docker-compose`): the file suits both."""
    return _compose_cli() or (["docker-compose"] if shutil.which("docker-compose") else None)


def _engine_problem() -> str | None:
    if not shutil.which("docker"):
        return "no docker command (bash scripts/setup.sh --tests installs Debian's docker.io as root)"
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`docker info` failed: {e}"
    if info.returncode != 0:
        return (f"no Docker engine answers (`docker info`: {info.stderr.strip()[:200]}); bash scripts/setup.sh "
                f"--tests starts dockerd as root")
    return None


def _base_image() -> str:
    """The README's default base where this machine has it, else the local one made from Debian's packages (no
    registry is asked: a pull would leave the machine)."""
    if os.environ.get("ROCKETRAFT_BASE_IMAGE"):
        return os.environ["ROCKETRAFT_BASE_IMAGE"]
    for image in ("python:3.11-slim", LOCAL_BASE_IMAGE):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30).returncode == 0:
            return image
    made = subprocess.run(["bash", "scripts/docker-base.sh"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, f"scripts/docker-base.sh failed:\n{made.stdout[-2000:]}\n{made.stderr[-2000:]}"
    return LOCAL_BASE_IMAGE


def _busy_ports(host: str) -> list[int]:
    import socket
    busy = []
    for port in HOST_PORTS:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                busy.append(port)
    return busy


class _Compose:
    def __init__(self, cli: list[str], env: dict[str, str]):
        self.cli, self.env = cli, env

    def __call__(self, *args: str, timeout: float = 180, check: bool = True, **env) -> subprocess.CompletedProcess:
        command = [*self.cli, "-p", TEST_PROJECT, "-f", str(COMPOSE_FILE), *args]
        done = subprocess.run(command, cwd=ROOT, env=dict(self.env, **env), capture_output=True, text=True,
                              timeout=timeout)
        assert not check or done.returncode == 0, (
            f"`{shlex.join(command)}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done


def _dangling_volumes() -> list[str]:
    listed = subprocess.run(["docker", "volume", "ls", "-q", "-f", "dangling=true"], capture_output=True, text=True,
                            timeout=60)
    return listed.stdout.split()


def _groups(admin) -> list:
    try:
        return admin.cluster_list()
    except Exception:  # noqa: BLE001 - the NameServer is not up yet, or lost its registrations: asked again
        return []


def _wait_master(admin, not_replica: str = "", timeout_s: float = MASTER_WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for group in _groups(admin):
            if group.group == GROUP and group.master and group.master != not_replica:
                return group
        time.sleep(0.1)
    pytest.fail(f"no master of {GROUP} (other than {not_replica or 'none'}) within {timeout_s} s: "
                f"{_groups(admin)}")


def _wait_rejoined(admin, replica: str, timeout_s: float = MASTER_WAIT_S) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        for group in _groups(admin):
            master = next((r for r in group.replicas if r.replica_id == group.master), None)
            mine = next((r for r in group.replicas if r.replica_id == replica), None)
            if master and mine and mine.role == "FOLLOWER" and mine.applied_index >= master.commit_index > 0:
                return time.monotonic() - started
        time.sleep(0.2)
    pytest.fail(f"replica {replica} did not rejoin {GROUP} as a caught-up follower within {timeout_s} s: "
                f"{_groups(admin)}")


def _readme_block(heading: str, language: str) -> str:
    text = (DOCKER_DIR / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def _consume_all(consumer, expected: int, timeout_s: float = 60) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        for message in consumer.receive(max_messages=32):
            consumer.ack(message)
            got.append(message)
    return got


def _send_under_load(producer, topic: str, stop, outcomes: dict) -> None:
    import rocketraft
    n = 0
    while not stop.is_set():
        body = f"load-{n}".encode()
        try:
            producer.send(rocketraft.Message(topic, body, keys=[body.decode()]))
            outcomes["ok"].append(body)
        except Exception as e:  # noqa: BLE001 - counted as failed, and shown
            outcomes["failed"].append(f"{body.decode()}: {type(e).__name__}: {e}")
        n += 1
        time.sleep(SEND_INTERVAL_S)


def test_the_compose_cluster_runs_as_the_readme_says_on_a_real_engine(tmp_path, capsys):
    import threading

    import rocketraft

    compose_cli = _any_compose_cli()
    problem = _engine_problem() or (None if compose_cli else "neither `docker compose` nor `docker-compose` is "
                                    "installed (bash scripts/setup.sh --tests installs Debian's docker-compose)")
    if problem:
        pytest.skip(f"cannot start the compose cluster: {problem}")
    busy = _busy_ports("127.0.0.1")
    assert not busy, (f"127.0.0.1 ports {busy} are in use (a `bash scripts/dev.sh` running?); the README's cluster "
                      f"publishes {HOST_PORTS} there: stop what holds them and run this test again")
    figures: dict[str, object] = {"compose": " ".join(compose_cli)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETRAFT_")}
    env.update(ROCKETRAFT_BASE_IMAGE=_base_image(), ROCKETRAFT_SUBNET_PREFIX=TEST_SUBNET_PREFIX)
    figures["base"] = env["ROCKETRAFT_BASE_IMAGE"]
    dc = _Compose(compose_cli, env)
    volumes_before = set(_dangling_volumes())
    secret_file = DOCKER_DIR / "cluster-secret"
    made_secret = not secret_file.exists()
    if made_secret:  # the README's two commands
        subprocess.run("python3 -c 'import secrets; print(secrets.token_hex(32))' > docker/cluster-secret && "
                       "chmod 644 docker/cluster-secret", shell=True, cwd=ROOT, check=True)
    cli_env = dict(env, ROCKETRAFT_CLUSTER_SECRET_FILE=str(secret_file))
    rocketraft_cli = str(Path(sys.executable).parent / "rocketraft")
    admin_config = rocketraft.ClientConfig(namesrv=("localhost:9876",), cluster_secret=secret_file.read_text().strip())
    try:
        started = time.monotonic()
        dc("up", "--build", "-d", timeout=UP_TIMEOUT_S)
        figures["up_s"] = round(time.monotonic() - started, 1)
        with rocketraft.Admin("localhost:9876", config=admin_config) as admin:
            first = _wait_master(admin)
            figures["first_master_s"] = round(time.monotonic() - started, 1)
            assert {r.address for r in first.replicas} == {"localhost:8081", "localhost:8082", "localhost:8083"}

            # The user, as the README makes it (app.key first), from the README's working directory (tmp_path).
            subprocess.run("python3 -c 'import secrets; print(secrets.token_hex(16))' > app.key", shell=True,
                           cwd=tmp_path, check=True)
            created = subprocess.run([rocketraft_cli, "admin", "createUser", "-u", "app", "--password-file",
                                      "app.key", "--user-type", "SUPER"], cwd=tmp_path, env=cli_env,
                                     capture_output=True, text=True, timeout=60)
            assert created.returncode == 0, f"createUser failed: {created.stdout}{created.stderr}"
            password = (tmp_path / "app.key").read_text().strip()

            # The README's official-SDK snippet, as written (the topic is auto-created at its first route query).
            snippet = tmp_path / "sdk_snippet.py"
            snippet.write_text(_readme_block("## The official SDK against it", "python"))
            ran = subprocess.run([sys.executable, str(snippet)], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=120)
            assert ran.returncode == 0 and "b'hello'" in ran.stdout, (
                f"the README's SDK snippet failed (exit {ran.returncode}):\n{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}")

            # Our client as the ACL user; load, and the master killed under it.
            user = rocketraft.ClientConfig(namesrv=("localhost:9876",), access_key="app", secret_key=password)
            outcomes: dict[str, list] = {"ok": [], "failed": []}
            stop = threading.Event()
            with rocketraft.Producer("localhost:9876", config=user) as producer:
                producer.send(rocketraft.Message("load", b"warm-up", keys=["warm-up"]))
                sender = threading.Thread(target=_send_under_load, args=(producer, "load", stop, outcomes))
                sender.start()
                try:
                    time.sleep(LOAD_BEFORE_KILL_S)
                    victim = _wait_master(admin).master
                    killed = time.monotonic()
                    dc("kill", f"broker-{victim}")
                    new_master = _wait_master(admin, not_replica=victim).master
                    figures["failover_s"] = round(time.monotonic() - killed, 2)
                    time.sleep(LOAD_AFTER_KILL_S)
                finally:
                    stop.set()
                    sender.join(timeout=60)
            figures.update(killed=victim, new_master=new_master, sent_ok=len(outcomes["ok"]),
                           failed=len(outcomes["failed"]))
            assert not outcomes["failed"], f"sends failed while the master was killed: {outcomes['failed'][:5]}"
            dc("start", f"broker-{victim}")
            figures["rejoin_s"] = round(_wait_rejoined(admin, victim), 1)
            with rocketraft.SimpleConsumer("localhost:9876", group="load-readers", subscriptions={"load": "*"},
                                           await_duration_s=2, config=user) as consumer:
                got = {m.body for m in _consume_all(consumer, len(outcomes["ok"]) + 1)}
            lost = set(outcomes["ok"]) - got
            figures["lost"] = len(lost)
            assert not lost, f"{len(lost)} acknowledged messages were not consumed, e.g. {sorted(lost)[:5]}"
            with rocketraft.Producer("localhost:9876", config=user) as producer:
                after = [f"after-{i}".encode() for i in range(AFTER_RESTART_MESSAGES)]
                for body in after:
                    producer.send(rocketraft.Message("load", body))
            stored = sum(q.broker_offset for q in admin.consumer_progress("load-readers", "load"))

        # down + up, with the README's recipe for clients elsewhere (the LAN address stood in for by a loopback one)
        dc("down")
        lan = {"ROCKETRAFT_ADVERTISED_HOST": LAN_STANDIN_HOST, "ROCKETRAFT_PUBLISH_HOST": LAN_STANDIN_HOST}
        dc("up", "-d", **lan)
        lan_ns = f"{LAN_STANDIN_HOST}:9876"
        lan_admin_config = rocketraft.ClientConfig(namesrv=(lan_ns,), cluster_secret=admin_config.cluster_secret)
        with rocketraft.Admin(lan_ns, config=lan_admin_config) as admin:
            restarted = _wait_master(admin)
            assert {r.address.rpartition(":")[0] for r in restarted.replicas} == {LAN_STANDIN_HOST}
            assert sum(q.broker_offset for q in admin.consumer_progress("load-readers", "load")) == stored, (
                "the topic's queues hold another number of messages after down + up")
            lan_user = rocketraft.ClientConfig(namesrv=(lan_ns,), access_key="app", secret_key=password)
            with rocketraft.SimpleConsumer(lan_ns, group="load-readers", subscriptions={"load": "*"},
                                           await_duration_s=2, config=lan_user) as consumer:
                again = sorted(m.body for m in _consume_all(consumer, len(after), timeout_s=30))
            assert again == sorted(after), (f"after down + up the group should get exactly the {len(after)} messages "
                                            f"it had not consumed (its offset kept): got {again[:12]}")
            found = admin.query_message_by_key("load", "load-0")
            assert [m.body for m in found] == [b"load-0"], f"the first loaded message by key: {found}"
        figures["stored_messages"] = stored
    except BaseException:
        logs = dc("logs", "--tail", "40", check=False, timeout=60)
        print(f"compose logs:\n{logs.stdout[-6000:]}")
        raise
    finally:
        dc("down", "-v", check=False, timeout=180)
        # the first `down` left the first NameServer container's anonymous /data volume (the image's VOLUME)
        leaked = [v for v in _dangling_volumes() if v not in volumes_before]
        if leaked:
            subprocess.run(["docker", "volume", "rm", *leaked], capture_output=True, timeout=60)
        if made_secret:
            secret_file.unlink(missing_ok=True)
        with capsys.disabled():
            print(f"\ncompose cluster figures: {json.dumps(figures)}")
