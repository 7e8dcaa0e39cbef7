"""A transaction check-back reaches a producer whose only Telemetry stream is on a follower (issue 33): the master
relays it (BrokerAdmin.RelayCheckBack, broker/checkbacks.py), the follower puts it on its own stream, and the answer
the producer gives there (EndTransaction on the follower, forwarded through Raft) commits the message."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

import grpc
import pytest
from brokerkit import client_metadata, messaging_stub, raw_message, wait_until

from broker.checkbacks import CheckBackRelay, deliver
from broker.clients import ClientRegistry
from rocketraft.protocol.limits import TELEMETRY_PENDING_MAX
from rocketraft.protocol.wire import Code, ipb, ipb_grpc, pb, svc

SETTINGS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000}
RPC_TIMEOUT_S = 5
CHECK_WAIT_S = 20  # transactionTimeOut and one check interval, on a loaded machine


class ProducerStream:
    """A producer's Telemetry stream open on one replica; the commands the broker sends on it, in a queue."""

    def __init__(self, stub, client_id: str, topic: str):
        self.commands: queue.Queue = queue.Queue()
        self._frames: queue.Queue = queue.Queue()
        frame = svc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PRODUCER))
        frame.settings.publishing.topics.add(name=topic)
        self._frames.put(frame)
        self._replies = stub.Telemetry(iter(self._frames.get, None), metadata=client_metadata(client_id))
        assert next(self._replies).status.code == Code.OK  # the settings are answered: the stream is open there
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for command in self._replies:
                self.commands.put(command)
        except Exception:  # noqa: BLE001 - cancelled at close
            pass

    def close(self) -> None:
        self._frames.put(None)
        self._replies.cancel()


@pytest.mark.parametrize("secret", ["", "relay-test-cluster-secret-0123456789"], ids=["no-secret", "cluster-secret"])
def test_a_check_back_reaches_a_producer_whose_only_stream_is_on_a_follower_and_its_answer_there_commits(
        make_cluster, secret):
    """With a cluster secret the relay is signed like every internal call (an unsigned one would be refused)."""
    cluster = make_cluster(broker_settings=SETTINGS, cluster_secret=secret)
    cluster.create_topic("relay-tx", queue_nums=1)
    master = cluster.wait_master()
    follower = next(i for i in cluster.ids if i != master)
    stub = messaging_stub(cluster, cluster.address_of[follower])
    stream = ProducerStream(stub, "relay-producer", "relay-tx")
    try:
        half = raw_message("relay-tx", b"half", message_type=pb.MessageType.TRANSACTION)
        sent = stub.SendMessage(svc.SendMessageRequest(messages=[half]), metadata=client_metadata("relay-producer"),
                                timeout=RPC_TIMEOUT_S)
        assert sent.status.code == Code.OK, sent.status
        message_id = half.system_properties.message_id
        command = stream.commands.get(timeout=CHECK_WAIT_S)
        assert cluster.wait_master() == master, "the master changed: the check-back did not test the relay"
        check = command.recover_orphaned_transaction_command
        assert (check.transaction_id, check.message.system_properties.message_id) == (message_id, message_id)
        assert check.message.body == b"half" and check.message.topic.name == "relay-tx"
        ended = stub.EndTransaction(svc.EndTransactionRequest(
            topic=pb.Resource(name="relay-tx"), message_id=message_id, transaction_id=check.transaction_id,
            resolution=pb.TransactionResolution.COMMIT, source=pb.TransactionSource.SOURCE_SERVER_CHECK),
            metadata=client_metadata("relay-producer"), timeout=RPC_TIMEOUT_S)
        assert ended.status.code == Code.OK, ended.status
        wait_until(lambda: [m.body for m in cluster.read_messages("relay-tx")] == [b"half"], 10,
                   "the committed message in its queue")
    finally:
        stream.close()
    if secret:  # unsigned, a relay is refused before it reaches the replica's streams
        with grpc.insecure_channel(cluster.address_of[follower]) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                ipb_grpc.BrokerAdminStub(channel).RelayCheckBack(ipb.RelayCheckBackRequest(group=cluster.group),
                                                                 timeout=RPC_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for replica in cluster.ids:
        with open(cluster.brokers[replica].log_path) as f:
            assert "Traceback" not in f.read(), f"{replica} logged a traceback"


def test_a_relayed_check_back_goes_on_a_producer_stream_here_and_no_further():
    def request(**fields) -> ipb.RelayCheckBackRequest:
        message = raw_message("t", b"half")
        return ipb.RelayCheckBackRequest(**{"group": "broker-a", "topic": "t", "producer_client_id": "p1",
                                            "message": message.SerializeToString(), "transaction_id": "x", **fields})

    async def scenario():
        clients = ClientRegistry(30_000, 10)
        assert deliver(request(), clients, "broker-a").delivered is False  # no producer connected here
        outbox: asyncio.Queue = asyncio.Queue(TELEMETRY_PENDING_MAX)
        session = clients.session("p1")
        session.client_type, session.outbox = pb.ClientType.PRODUCER, outbox
        other = deliver(request(), clients, "broker-b")
        assert (other.code, other.delivered) == (Code.BAD_REQUEST, False) and "group 'broker-a'" in other.message
        garbage = deliver(request(message=b"\xff\xff"), clients, "broker-a")
        assert (garbage.code, garbage.delivered) == (Code.BAD_REQUEST, False)
        assert deliver(request(), clients, "broker-a").delivered is True
        assert outbox.get_nowait().recover_orphaned_transaction_command.transaction_id == "x"
        while not outbox.full():
            outbox.put_nowait(svc.TelemetryCommand())
        full = deliver(request(), clients, "broker-a")  # a producer that reads nothing: not queued past the bound
        assert (full.code, full.delivered) == (Code.OK, False) and "full" in full.message

    asyncio.run(scenario())


def test_a_relay_to_a_replica_that_cannot_be_reached_is_logged_at_info_and_skipped_for_a_while(caplog):
    """The check is made again at the next interval, as without a relay; a dead replica costs one try, not one per
    half message."""
    from devkit.devcluster import free_port

    dead = f"127.0.0.1:{free_port()}"
    asked = []

    async def replicas():
        asked.append(1)
        return [ipb.BrokerRegistration(replica_id="n0", address="127.0.0.1:1"),  # this replica: never asked
                ipb.BrokerRegistration(replica_id="n1", address=dead)]

    async def scenario():
        relay = CheckBackRelay(replicas, "n0", "broker-a")
        try:
            first = await relay.relay(raw_message("t", b"half"), "x1", "p1", "")
            second = await relay.relay(raw_message("t", b"half"), "x2", "p1", "")
        finally:
            await relay.close()
        return first, second

    with caplog.at_level(logging.INFO, logger="broker.checkbacks"):
        assert asyncio.run(scenario()) == (None, None)
    failures = [r for r in caplog.records if "cannot relay" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in failures] == [(logging.INFO, None)], caplog.text
    assert dead in failures[0].getMessage() and "replica n1" in failures[0].getMessage()
    assert len(asked) == 2  # the addresses are asked again after a failure (the replica may have moved)
