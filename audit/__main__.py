"""python -m audit (--cluster-dir DIR | --store PATH ...) [--history history.jsonl] [--out DIR] [--master URL]

Exit codes: 0 every check passed, 1 a divergence or violation was found, 2 bad arguments (the message says
which and what to do), 3 the audit itself failed (Spark or an unexpected error; traceback on stderr).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

EXIT_VALID, EXIT_INVALID, EXIT_BAD_ARGUMENTS, EXIT_FAILED = 0, 1, 2, 3


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster-dir", help="a DevCluster directory: audits every store/<group>/<replica>")
    where.add_argument("--store", action="append", help="a replica's store directory (repeat for each replica)")
    parser.add_argument("--history", help="a chaos run's history.jsonl: check its acknowledged sends")
    parser.add_argument("--out", default="audit-out", help="where audit.json and audit.txt go (default audit-out)")
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    parser.add_argument("--partition-entries", type=int, default=2000,
                        help="Raft entries per Spark partition when reading logs (default 2000)")
    args = parser.parse_args(argv)
    if args.partition_entries < 1:
        parser.error("--partition-entries must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    from .stores import AuditInputError, SparkStartError

    try:
        from .job import run, summary  # imports pyspark: a missing one is a failed audit (3), not a verdict

        report = run([args.cluster_dir] if args.cluster_dir else args.store, args.history, args.out, args.master,
                     partition_entries=args.partition_entries)
    except AuditInputError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except SparkStartError as exc:
        print(f"audit: {exc}; nothing was concluded", file=sys.stderr)
        return EXIT_FAILED
    except Exception:  # noqa: BLE001 - reported with its traceback; the exit code says the audit did not run
        traceback.print_exc()
        print("audit: the audit itself failed (see the traceback above); nothing was concluded", file=sys.stderr)
        return EXIT_FAILED
    print(summary(report), end="")
    print(f"report: {args.out}/audit.json, {args.out}/audit.txt")
    return EXIT_VALID if report["valid"] else EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
