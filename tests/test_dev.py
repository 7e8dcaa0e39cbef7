"""The README's main job: `rocketraft dev` runs a NameServer and a 3-replica group, fails over, stops cleanly."""

import json
import subprocess
import sys

from devkit.devcluster import free_dev_ports, free_port
from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request
from tests.remoting.rclient import call


def test_dev_cluster_serves_fails_over_and_stops_cleanly(tmp_path):
    (namesrv_port, broker_port), dashboard_port = free_dev_ports(), free_port()
    out = subprocess.run(
        [sys.executable, "-m", "cli", "dev", "--fresh", "--data-dir", str(tmp_path / "dev"),
         "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port), "--seconds", "9",
         "--kill-master-every", "4", "--no-view", "--dashboard-port", str(dashboard_port)],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "master is n" in out.stdout
    assert f"dashboard: http://127.0.0.1:{dashboard_port} (read-only)" in out.stdout, out.stdout
    assert "kill -9 master" in out.stdout or "new master" in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith("stopped"), out.stdout[-500:]
    logs = (tmp_path / "dev" / "logs")
    assert sorted(p.name for p in logs.iterdir()) == ["broker-a-n0.log", "broker-a-n1.log", "broker-a-n2.log",
                                                       "namesrv.log"]


def test_sigterm_stops_every_process_of_the_dev_cluster(tmp_path):
    import os
    import signal
    import time

    namesrv_port, broker_port = free_dev_ports()
    dev = subprocess.Popen([sys.executable, "-m", "cli", "dev", "--fresh", "--data-dir", str(tmp_path / "d"),
                            "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port), "--no-view"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert "master is n" in dev.stdout.readline()
        children = subprocess.run(["pgrep", "-f", str(tmp_path / "d")], capture_output=True, text=True).stdout.split()
        assert len(children) >= 4, children  # the NameServer and three replicas
        # README, "RocketMQ 4.x applications": the NameServer's Remoting door on its gRPC port + 1, the replicas' on
        # theirs + 2830 (9877 and 10911-10913 with the defaults)
        answer = call(f"127.0.0.1:{namesrv_port + 1}", frame.Command(Request.GET_BROKER_CLUSTER_INFO, opaque=1))
        addresses = json.loads(answer.body)["brokerAddrTable"]["broker-a"]["brokerAddrs"].values()
        assert sorted(addresses) == [f"127.0.0.1:{broker_port + i + 2830}" for i in range(3)], answer
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in children):
            time.sleep(0.1)
        left = [pid for pid in children if os.path.exists(f"/proc/{pid}")
                 and "zombie" not in open(f"/proc/{pid}/status").read().lower()]
        assert not left, f"processes outlived `rocketraft dev`: {left}"
    finally:
        dev.kill()


def test_dev_names_the_port_in_use_and_the_flag_that_moves_it(tmp_path):
    import socket

    namesrv_port, broker_port = free_dev_ports()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", broker_port + 1 + 2830))
        squatter.listen()
        out = subprocess.run([sys.executable, "-m", "cli", "dev", "--fresh", "--data-dir",
                              str(tmp_path / "d"), "--namesrv-port", str(namesrv_port), "--broker-port",
                              str(broker_port), "--seconds", "1", "--no-view", "--dashboard-port", "0"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert f"port {broker_port + 2831}, n1's Remoting door (--broker-port + 2831)" in out.stderr, out.stderr
    assert "choose other --namesrv-port / --broker-port" in out.stderr, out.stderr
    assert not (tmp_path / "d" / "logs").exists() or not any((tmp_path / "d" / "logs").iterdir()), "nothing started"
