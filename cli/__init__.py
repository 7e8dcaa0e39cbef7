"""The command line: `rocketraft send / consume / admin / namesrv / broker / dashboard / dev / demo / bench`
(main; admin and auth: the admin commands; messaging: send and consume; tls: the client TLS flags). It is the only
library code that may import the tooling (devkit, bench), and only inside a subcommand (tests/test_layers.py).
"""
