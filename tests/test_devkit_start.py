"""The dev cluster's own start-up: ports it hands out never repeat, and a server that cannot start says why."""

import socket

import pytest

from devkit.devcluster import DevCluster
from devkit.localcluster import free_port


def test_free_port_never_hands_out_the_same_port_twice_in_one_process():
    ports = [free_port("127.0.0.1") for _ in range(3000)]
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("listener", ["clients", "raft"])
def test_a_broker_that_cannot_listen_fails_to_start_and_the_error_quotes_its_log(tmp_path, listener):
    cluster = DevCluster(str(tmp_path), replicas=1)
    host, port = (cluster.address_of if listener == "clients" else cluster.raft_of)["n0"].split(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        try:
            cluster.namesrv.start(cluster.env)
            with pytest.raises(RuntimeError) as failure:
                cluster.start_replica("n0")
        finally:
            cluster.stop()
    message = str(failure.value)
    assert "n0 did not start" in message and "exit code 1" in message
    expected = {"clients": f"cannot listen on {host}:{port}: the port is in use",
                "raft": f"ListenError: replica broker-a/n0 cannot listen for its Raft peers on {host}:{port}"}
    assert expected[listener] in message
