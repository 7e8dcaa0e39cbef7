"""`rocketraft send`, `rocketraft recall` and `rocketraft consume`: quick use of a cluster from the shell, with a
progress display on long runs.

    rocketraft send -t orders --body 'hello' --tag TagA --keys k1      # prints SEND_OK ... recall <handle>
    rocketraft recall -t orders broker-a:5f0c...:01AB...                # no group that has not got it will
    rocketraft send -t orders --count 100000 --size 1024 --concurrency 512
    rocketraft consume -t orders -g billing --tag 'TagA || TagB' --count 10 --print
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import tls as cli_tls
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer
from rocketraft.protocol.errors import RocketraftError

PROGRESS_MIN_COUNT = 1000  # below this a progress bar is noise


def add_send_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namesrvAddr", default="127.0.0.1:9876")
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("--body", help="message body (text); default: --size random bytes")
    parser.add_argument("--size", type=int, default=1024, help="body bytes when --body is not given")
    parser.add_argument("--count", type=int, default=1, help="messages to send")
    parser.add_argument("--tag")
    parser.add_argument("--keys", default="", help="comma-separated keys")
    parser.add_argument("--message-group", help="FIFO: messages of one group are stored and consumed in order")
    parser.add_argument("--delay-level", type=int, help="1..18 (1s 5s 10s 30s 1m ... 2h)")
    parser.add_argument("--concurrency", type=int, default=256, help="sends in flight at once")
    parser.add_argument("--linger-ms", type=float, default=0.0,
                        help="wait up to this long for more messages to share a request (the producer's linger_ms; "
                             "default 0)")
    parser.add_argument("--retries", type=int, default=2,
                        help="resends on another broker group after a definite refusal, 0..16 (the producer's "
                             "retries; default 2)")
    cli_tls.add_arguments(parser)


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namesrvAddr", default="127.0.0.1:9876")
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("-g", "--consumerGroup", required=True)
    parser.add_argument("--tag", default="*", help="subscription expression: '*' or 'TagA || TagB'")
    parser.add_argument("--count", type=int, default=0, help="stop after this many messages (0 = no limit)")
    parser.add_argument("--idle-timeout", type=float, default=0.0,
                        help="stop after this many seconds without a message (0 = never)")
    parser.add_argument("--print", action="store_true", help="print each message")
    cli_tls.add_arguments(parser)


def run_send(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.count < 1 or args.concurrency < 1 or args.size < 1:
        console.print("[red]error:[/red] --count, --concurrency and --size must be at least 1")
        return 2
    try:
        return asyncio.run(_send(args, console))
    except RocketraftError as exc:
        console.print(f"[red]error ({exc.code}):[/red] {escape(exc.message)}", highlight=False)
        return 1


async def _send(args, console: Console) -> int:
    body = args.body.encode() if args.body is not None else os.urandom(args.size)
    keys = [k for k in args.keys.split(",") if k]
    latencies: list[float] = []
    failures: list[str] = []
    async with Producer(topics=[args.topic], retries=args.retries, linger_ms=args.linger_ms,
                        config=cli_tls.client_config(args)) as producer:
        slots = asyncio.Semaphore(args.concurrency)
        with _progress(console, args.count, "sent") as progress:
            task = progress.add_task("send", total=args.count)

            async def one() -> None:
                async with slots:
                    started = time.perf_counter()
                    try:
                        receipt = await producer.send(Message(args.topic, body, tag=args.tag, keys=keys,
                                                              message_group=args.message_group,
                                                              delay_level=args.delay_level))
                    except RocketraftError as exc:
                        failures.append(f"{type(exc).__name__}: {exc.message}")
                    else:
                        latencies.append(time.perf_counter() - started)
                        if args.count == 1:
                            print(f"SEND_OK {receipt.message_id} {receipt.queue} offset {receipt.offset} "
                                  f"recall {receipt.recall_handle}")
                    progress.advance(task)

            began = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(args.count)))
            elapsed = time.perf_counter() - began
    _summary(console, args.count, len(body), latencies, failures, elapsed)
    return 1 if failures else 0


def _progress(console: Console, total: int, what: str) -> Progress:
    return Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                    disable=total < PROGRESS_MIN_COUNT or not console.is_terminal)


def _summary(console: Console, count: int, size: int, latencies: list[float], failures: list[str],
             elapsed: float) -> None:
    if count == 1 and not failures:
        return
    latencies.sort()
    ok = len(latencies)
    if ok:
        p50, p99 = latencies[ok // 2] * 1000, latencies[min(ok - 1, int(ok * 0.99))] * 1000
        console.print(f"{ok} acknowledged in {elapsed:.2f} s: {ok / elapsed:,.0f} msg/s, "
                      f"{ok * size / elapsed / 1e6:.1f} MB/s, latency p50 {p50:.2f} ms p99 {p99:.2f} ms",
                      highlight=False)
    if failures:
        console.print(f"[red]{len(failures)} failed[/red]; first: {escape(failures[0])}", highlight=False)


def add_recall_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namesrvAddr", default="127.0.0.1:9876")
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("recall_handle", help="the recall handle `rocketraft send` printed (SendReceipt.recall_handle)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to get an answer (a recall is idempotent)")
    cli_tls.add_arguments(parser)


def run_recall(args: argparse.Namespace) -> int:
    """Prints RECALLED <message id> and the broker's answer (which consumer groups had the message already)."""
    console = Console(stderr=True)
    try:
        result = asyncio.run(_recall(args))
    except RocketraftError as exc:
        console.print(f"[red]error ({exc.code}):[/red] {exc.message}", highlight=False)
        return 1
    print(f"RECALLED {result.message_id}: {result.answer}")
    return 0


async def _recall(args):
    async with Producer(config=cli_tls.client_config(args)) as producer:
        return await producer.recall(args.recall_handle, args.topic, timeout_s=args.timeout)


def run_consume(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        return asyncio.run(_consume(args, console))
    except RocketraftError as exc:
        console.print(f"[red]error ({exc.code}):[/red] {escape(exc.message)}", highlight=False)
        return 1
    except KeyboardInterrupt:
        return 130


async def _consume(args, console: Console) -> int:
    from rocketraft.client.simple_consumer import SimpleConsumer

    received = 0
    last_at = time.monotonic()
    async with SimpleConsumer(group=args.consumerGroup, subscriptions={args.topic: args.tag},
                              await_duration_s=5.0, config=cli_tls.client_config(args)) as consumer:
        with _progress(console, args.count or PROGRESS_MIN_COUNT, "received") as progress:
            task = progress.add_task("consume", total=args.count or None)
            while not args.count or received < args.count:
                if args.idle_timeout and time.monotonic() - last_at > args.idle_timeout:
                    break
                batch = await consumer.receive(max_messages=min(32, (args.count - received) or 32))
                for message in batch:
                    if args.print:
                        print(f"{message.message_id} {message.queue}@{message.queue_offset} tag={message.tag} "
                              f"keys={','.join(message.keys)} attempt={message.delivery_attempt} "
                              f"body={message.body[:200]!r}", flush=True)
                    await consumer.ack(message)
                received += len(batch)
                progress.advance(task, len(batch))
                if batch:
                    last_at = time.monotonic()
    console.print(f"{received} message(s) consumed and acknowledged", highlight=False)
    return 0


