"""`rocketraft dev`: a local cluster for development: one NameServer and one broker group of 3 replicas.

Every part is a real process on 127.0.0.1 (NameServer on --namesrv-port, 9876 by default; brokers on
--broker-port, +1, +2), with data under --data-dir and logs in <data-dir>/logs. Point any RocketMQ 5 client
at 127.0.0.1:9876. Topics are auto-created on first use. The view shows each replica's role, Raft term,
commit and applied index and lag; `--kill-master-every N` kills the master with SIGKILL every N seconds and
restarts it, so failover can be watched. The web dashboard (docs/dashboard.md) runs beside it on
http://127.0.0.1:8088 (--dashboard-port; 0 = none), read-only unless --dashboard-allow-changes.
Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import time

from .devcluster import DevCluster, Proc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=os.path.join(os.getcwd(), ".rocketraft-dev"),
                        help="stores and logs (default: ./.rocketraft-dev)")
    parser.add_argument("--fresh", action="store_true", help="delete --data-dir first")
    parser.add_argument("--namesrv-port", type=int, default=9876)
    parser.add_argument("--broker-port", type=int, default=8081, help="first broker's gRPC port (default 8081)")
    parser.add_argument("--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], default="ASYNC_FLUSH",
                        help="flushDiskType of every replica (default ASYNC_FLUSH, RocketMQ's default)")
    parser.add_argument("--seconds", type=float, default=0,
                        help="stop this long after the cluster has a master (default: until Ctrl-C)")
    parser.add_argument("--kill-master-every", type=float, default=0, metavar="SECONDS",
                        help="kill -9 the master this often and restart it (default: never)")
    parser.add_argument("--no-view", action="store_true", help="print a status line every 5 s instead of a live view")
    parser.add_argument("--dashboard-port", type=int, default=8088,
                        help="serve the web dashboard on 127.0.0.1:PORT (default 8088; 0 = no dashboard)")
    parser.add_argument("--cluster-secret", action="store_true",
                        help="make a random cluster secret (in DATA_DIR/cluster-secret) that internal calls must "
                             "prove; admin tools then need ROCKETRAFT_CLUSTER_SECRET_FILE=DATA_DIR/cluster-secret "
                             "(docs/security.md). Default: off, internal traffic unauthenticated")
    parser.add_argument("--tls", action="store_true",
                        help="make a local CA and certificates (in DATA_DIR/tls) and serve every port in permissive "
                             "TLS mode: TLS and plaintext clients both connect (docs/security.md, \"TLS\")")
    parser.add_argument("--dashboard-allow-changes", action="store_true",
                        help="let the dashboard create/delete topics and groups, resend and recall (default read-only)")


def start_dashboard(cluster: DevCluster, port: int, allow_changes: bool) -> tuple[Proc | None, str]:
    """The dashboard as a process of its own (it stops with us, even on SIGKILL: parentwatch); its URL, or why
    it did not start (dev goes on without it)."""
    args = [sys.executable, "-m", "dashboard", "--namesrv", ";".join(cluster.namesrv_addresses),
            "--listen", f"127.0.0.1:{port}"] + (["--allow-changes"] if allow_changes else [])
    proc = Proc("dashboard", args, os.path.join(cluster.base_dir, "dashboard.log"))
    try:
        proc.start(cluster.env)
    except RuntimeError as exc:
        return None, f"dashboard not started ({str(exc).splitlines()[-1]}); try --dashboard-port"
    return proc, f"dashboard: http://127.0.0.1:{port}" + ("" if allow_changes else " (read-only)")


def tls_help(cluster: DevCluster) -> str:
    ca = cluster.certs.ca_file
    return (f"TLS permissive (TLS and plaintext on every port); CA {ca}: `rocketraft send --ca-file {ca} ...`, or "
            f"export ROCKETRAFT_TLS_CA_FILE={ca}; official Python SDK: tls_enable=True with "
            f"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH={ca}")


def render(cluster: DevCluster, events: list[str], started: float, dashboard: str = "") -> str:
    statuses = cluster.statuses()
    commit = max((st.commit_index for st in statuses.values() if st), default=0)
    master = cluster.master()
    lines = [f"rocketraft dev: NameServer {cluster.namesrv_address}, group {cluster.group}, "
             f"{time.monotonic() - started:6.1f}s   (Ctrl-C stops)", "",
             f"{'replica':8} {'address':22} {'brokerId':>8} {'role':15} {'term':>5} {'commit':>8} {'applied':>8} "
             f"{'lag':>5}"]
    for replica_id in cluster.ids:
        st = statuses[replica_id]
        if st is None:
            lines.append(f"{replica_id:8} {cluster.address_of[replica_id]:22} {'':>8} (down)")
            continue
        broker_id = 0 if replica_id == master else st.follower_broker_id
        lines.append(f"{replica_id:8} {st.address:22} {broker_id:>8} {st.role:15} {st.term:>5} {st.commit_index:>8} "
                     f"{st.applied_index:>8} {commit - st.applied_index:>5}")
        if st.failure:  # role STOPPED: why, and what to do
            lines.append(f"{'':8} stopped: {st.failure}")
    lines += ["", f"master (routes, brokerId 0): {master or '(none: election in progress)'}", "",
              "recent events:"] + [f"  {e}" for e in events[-6:]]
    lines += ["", *([dashboard] if dashboard else []),
              f"logs: {cluster.base_dir}/logs   quickstart: see README (official SDK against "
              f"{cluster.namesrv_address})"]
    if cluster.namesrv_remoting_addresses:
        lines.append(f"RocketMQ 4.x clients (docs/client.md): namesrvAddr {cluster.namesrv_remoting_addresses[0]}")
    if cluster.metrics_address_of:
        lines.append("metrics (docs/metrics.md): " + "  ".join(
            [f"{i} http://{a}/metrics" for i, a in cluster.metrics_address_of.items()]
            + [f"namesrv http://{a}/metrics" for a in cluster.namesrv_metrics_addresses]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.fresh and os.path.exists(args.data_dir):
        shutil.rmtree(args.data_dir)
    ports = (args.broker_port, args.broker_port + 1, args.broker_port + 2)
    secret = _cluster_secret(args.data_dir) if args.cluster_secret else ""
    cluster = DevCluster(args.data_dir, flush=args.flush, namesrv_port=args.namesrv_port, broker_ports=ports,
                         cluster_secret=secret, tls_mode="permissive" if args.tls else "")
    taken = cluster.ports_in_use()
    if taken:
        print("rocketraft dev: cannot start, a port it listens on is in use:\n  " + "\n  ".join(taken)
              + "\nstop what holds it (`ss -ltnp`), or choose other --namesrv-port / --broker-port", file=sys.stderr)
        return 1
    events: list[str] = [f"cluster secret on: export ROCKETRAFT_CLUSTER_SECRET_FILE={args.data_dir}/cluster-secret "
                         f"before `rocketraft admin`"] if secret else []
    if cluster.certs is not None:
        events.append(tls_help(cluster))
    started = time.monotonic()
    # SIGTERM (kill, a service manager, a CI timeout) stops the cluster like Ctrl-C: its processes run in their own
    # sessions and would otherwise outlive this one.
    signal.signal(signal.SIGTERM, _interrupt)
    dashboard, dashboard_line = None, ""
    printed_events = 0
    try:
        cluster.start()
        events.append(f"master is {cluster.wait_master(timeout_s=30)}")
        started = time.monotonic()  # --seconds and --kill-master-every count from a serving cluster
        if args.dashboard_port:
            dashboard, dashboard_line = start_dashboard(cluster, args.dashboard_port, args.dashboard_allow_changes)
            events.append(dashboard_line)
        next_kill = started + args.kill_master_every if args.kill_master_every else None
        last_print = 0.0
        while not args.seconds or time.monotonic() - started < args.seconds:
            now = time.monotonic()
            if next_kill and now >= next_kill:
                _kill_and_restart(cluster, events)
                next_kill = time.monotonic() + args.kill_master_every
            if not args.no_view:
                sys.stdout.write("\x1b[H\x1b[2J" + render(cluster, events, started, dashboard_line) + "\n")
                sys.stdout.flush()
            else:
                for event in events[printed_events:]:
                    print(event, flush=True)
                printed_events = len(events)
                if now - last_print >= 5:
                    print(render(cluster, events, started).splitlines()[0], flush=True)
                    last_print = now
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"rocketraft dev: {exc}", file=sys.stderr)
        return 1
    finally:
        if dashboard is not None:
            dashboard.stop()
        cluster.stop()
    if args.no_view:  # what happened after the last look (a start slower than --seconds prints everything here)
        for event in events[printed_events:]:
            print(event, flush=True)
    print(render(cluster, events, started).splitlines()[0].split(",")[0] + ": stopped")
    return 0


def _cluster_secret(data_dir: str) -> str:
    """A random secret kept in data_dir/cluster-secret (readable by this user only), made once."""
    path = os.path.join(data_dir, "cluster-secret")
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    with open(path) as f:
        return f.read().strip()


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _kill_and_restart(cluster: DevCluster, events: list[str]) -> None:
    master = cluster.master()
    if master is None:
        return
    killed_at = time.monotonic()
    cluster.kill(master)
    events.append(f"{time.strftime('%H:%M:%S')} kill -9 master {master}")
    new_master = cluster.wait_master(timeout_s=30, not_id=master)
    events.append(f"{time.strftime('%H:%M:%S')} new master {new_master} after {time.monotonic() - killed_at:.2f}s")
    cluster.start_replica(master)
    events.append(f"{time.strftime('%H:%M:%S')} {master} restarted (follower)")
