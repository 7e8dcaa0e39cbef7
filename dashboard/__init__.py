"""The web dashboard (`rocketraft dashboard`, docs/dashboard.md): cluster and Raft timeline, topics, consumer
groups, messages and dead letters, read from the admin API the CLI uses. Read-only unless started with
--allow-changes.

    from dashboard.app import create_app       # the ASGI app
    python -m dashboard --namesrv 127.0.0.1:9876  # the server
"""
