"""Development and test tooling: local clusters of real processes, the `rocketraft dev` / `rocketraft demo`
commands, fault helpers and the chaos-history file format. Used by tests/, bench/, jepsen_tests/ and audit/.

Library code (dledger/, broker/, namesrv/, rocketraft/) never imports this package; only cli/main.py does,
inside the subcommands that run it (tests/test_layers.py checks both).

    devcluster   DevCluster: NameServers + one broker group of real processes (`python -m namesrv` / `broker`)
    localcluster LocalCluster: a dledger group of real replica processes; free_port
    node         `python -m devkit.node`: one stand-alone dledger replica process (LocalCluster starts it)
    control      the control channel of that process (ControlServer, ControlClient)
    counting     CountingStateMachine: the state machine of that process and of in-process dledger tests
    dev, demo    `rocketraft dev` and `rocketraft demo`
    diskfault    tmpfs mounts and ballast files (bench repros, chaos runs, tests)
    storefault   faults planted in a stopped replica's store: a flipped bit, rewritten terms, a torn file
    history      the chaos history format (history.jsonl): written by jepsen_tests, read by its checker and audit
"""
