"""The CPU cost of each step a message takes on the send path, in one process, without a cluster (issue 16).

    python -m bench hotpath                   # every step, best of 5 rounds
    python -m bench hotpath --rounds 9 --messages 20000

A cluster's throughput on this 2-core machine is the machine's CPU divided by what every process spends per
message, so these per-message costs (process time, not wall time: another process's load changes them little)
are what a change to the send path should move. Each step runs on real objects: the official SDK's v2 Message,
the broker's door and state machine on a real LMDB store in a temporary directory.

  client      Message -> its wire bytes (rocketraft's producer: checks, id, to_wire)
  door        the broker's check and encoding of one received message (validation.message, the SendCommand)
  apply-256   the state machine's apply of one message of a 256-message entry (with the entry's LMDB commit)
  apply-1     the apply of a one-message entry, as a lone sync send makes (with its LMDB commit)

The lowest round is reported (the least disturbed by the rest of the machine), with the median beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

from broker import validation
from broker.config import BrokerConfig
from broker.statemachine import BrokerStateMachine
from broker.writes import Writes
from dledger import LogEntry
from dledger.store import Store
from rocketraft.client.message import Message, MessageIdGenerator, to_pb, to_wire
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import ipb, pb

TOPIC = "hotpath"
QUEUES = 8
BODY = b"x" * 1024


def client_step(messages: int) -> Callable[[], tuple[int, float]]:
    ids = MessageIdGenerator()

    def step() -> tuple[int, float]:
        began = time.process_time()
        for i in range(messages):
            message = Message(TOPIC, BODY)
            message.validate()
            message.message_id = ids.next()
            to_wire(message, i % QUEUES)
        return messages, time.process_time() - began
    return step


class _Guards:
    def check_send(self, body_bytes: int) -> None:  # the disk and map guards read cached state: not measured
        pass


class _Broker:
    def __init__(self, config: BrokerConfig):
        self.config, self.guards = config, _Guards()


def door_step(messages: int) -> Callable[[], tuple[int, float]]:
    config = BrokerConfig()
    writes = Writes.__new__(Writes)  # the door's methods alone: no replica, no batcher
    writes.broker, writes.config, writes._round_robin, writes.traffic = _Broker(config), config, itertools.count(), None
    topic = ipb.TopicConfig(name=TOPIC, queue_nums=QUEUES, perm=6)
    ids = MessageIdGenerator()
    wire = [to_pb(_named(ids), i % QUEUES).SerializeToString() for i in range(messages)]

    def step() -> tuple[int, float]:
        began = time.process_time()
        now = int(time.time() * 1000)
        for data in wire:
            message = pb.Message.FromString(data)  # as grpc's deserializer hands it over
            kind = validation.message(message, config, now)
            writes._send_command(message, kind, topic, now, "hotpath-client", b"0123456789abcdef")
        return messages, time.process_time() - began
    return step


def _named(ids: MessageIdGenerator) -> Message:
    message = Message(TOPIC, BODY)
    message.message_id = ids.next()
    return message


def _send_command(queue: int) -> bytes:
    message_id = uuid.uuid4().hex.upper()
    message = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY,
                         system_properties=pb.SystemProperties(message_id=message_id))
    send = spb.SendCommand(message=message.SerializeToString(), queue_id=queue, store_ms=int(time.time() * 1000),
                           topic=TOPIC, message_id=message_id, recall_token=os.urandom(16))
    return spb.Command(send=send).SerializeToString()


class _Applier:
    """A state machine on a real store, applying entries as dledger does (one write transaction per entry)."""

    def __init__(self, directory: str):
        self.store = Store(os.path.join(directory, "store"), 1 << 32, sync_commits=False)
        self.store.bind_writer()
        self.machine = BrokerStateMachine()
        self.machine.attach(self.store)
        self.index = 0
        config = ipb.TopicConfig(name=TOPIC, queue_nums=QUEUES, perm=6)
        self.apply([spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString())).SerializeToString()])

    def apply(self, payloads: list[bytes]) -> None:
        self.index += 1
        txn = self.store.write_txn()
        self.machine.apply(LogEntry(self.index, 1, payloads), txn)
        self.store.commit()


def apply_step(applier: _Applier, messages: int, per_entry: int) -> Callable[[], tuple[int, float]]:
    def step() -> tuple[int, float]:
        entries = [[_send_command(i % QUEUES) for i in range(per_entry)] for _ in range(max(1, messages // per_entry))]
        began = time.process_time()  # the commands are built first, outside the measurement
        for payloads in entries:
            applier.apply(payloads)
        return len(entries) * per_entry, time.process_time() - began
    return step


def _measure(step: Callable[[], tuple[int, float]], rounds: int) -> tuple[float, float]:
    """(lowest, median) process-time microseconds per message over the rounds."""
    samples = []
    for _ in range(rounds):
        count, seconds = step()
        samples.append(seconds / count * 1e6)
    return min(samples), statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench hotpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=10_000, help="messages per round of each step")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as directory:
        applier = _Applier(directory)
        steps = {"client": client_step(args.messages), "door": door_step(args.messages),
                 "apply-256": apply_step(applier, args.messages, 256),
                 "apply-1": apply_step(applier, args.messages // 4, 1)}
        figures = {name: _measure(step, args.rounds) for name, step in steps.items()}
        applier.store.close()
    print(f"{'step':10s} {'us/message (lowest)':>20s} {'median':>8s}")
    for name, (low, median) in figures.items():
        print(f"{name:10s} {low:20.2f} {median:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: {"lowest_us": low, "median_us": median} for name, (low, median) in figures.items()}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
