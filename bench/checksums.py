"""What dledger's entry checksums cost: `python -m bench.checksums` (a micro-benchmark, one process, ~20 s).

For several batch shapes: encode + decode with the batch layout before checksums (version 1, reproduced here as
it was in dledger/codec.py up to commit ed0cae5) and with dledger.codec now (version 2, CRC-32C); the follower's
check of a received command (logformat.verify_command) and the check of a stored value (verify_value: what the
journal's bulk reads and the scrub do). Best of 7 rounds; figures in microseconds.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable

from dledger import codec, logformat

SHAPES = (("256 x 1 KiB", 256, 1024), ("1 x 1 KiB", 1, 1024), ("16 x 64 KiB", 16, 65536), ("1 x 1 MiB", 1, 1 << 20))
_HEAD_V1 = struct.Struct(">BI")


def encode_v1(payloads: list[bytes]) -> bytes:
    count = len(payloads)
    lengths = struct.pack(f">{count}I", *(len(p) for p in payloads))
    return b"".join((_HEAD_V1.pack(1, count), lengths, *payloads))


def decode_v1(blob: bytes) -> list[bytes]:
    view = memoryview(blob)
    _version, count = _HEAD_V1.unpack_from(view)
    lengths = struct.unpack_from(f">{count}I", view, _HEAD_V1.size)
    if _HEAD_V1.size + 4 * count + sum(lengths) != len(view):
        raise ValueError("batch length mismatch")
    pos, out = _HEAD_V1.size + 4 * count, []
    for n in lengths:
        out.append(bytes(view[pos : pos + n]))
        pos += n
    return out


def best_us(fns: list[Callable[[], object]], reps: int, rounds: int = 7) -> list[float]:
    """The fastest round of each function, rounds interleaved (so a busy moment of a shared machine hits all)."""
    fastest = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            started = time.perf_counter()
            for _ in range(reps):
                fn()
            fastest[i] = min(fastest[i], (time.perf_counter() - started) / reps)
    return [f * 1e6 for f in fastest]


def main() -> int:
    print("shape        | encode+decode v1 | encode+decode v2 | added | receipt check | stored-value check")
    for label, count, size in SHAPES:
        payloads = [os.urandom(size) for _ in range(count)]
        reps = max(50, int(5e7 // (count * size)))
        command = logformat.REGULAR_COMMAND + logformat.encode_call(0, codec.encode_batch(payloads))
        value = logformat.encode_value(command, 3)
        before, after, receipt, stored = best_us([
            lambda p=payloads: decode_v1(encode_v1(p)),
            lambda p=payloads: codec.decode_batch(codec.encode_batch(p)),
            lambda c=command: logformat.verify_command(c, 0),
            lambda v=value: logformat.verify_value(5, v, 0)], reps)
        print(f"{label:<12} | {before:13.1f} us | {after:13.1f} us | {after - before:+5.1f} | {receipt:10.1f} us | "
              f"{stored:9.1f} us ({len(value) / stored / 1.048576:,.0f} MiB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
