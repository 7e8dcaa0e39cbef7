"""namesrv: the NameServer. Brokers register their replicas here; clients ask it for routes.

- `namesrv.registry.RouteRegistry`: pure routing logic (which replica is master, which queues a topic has).
- `namesrv.core.NameServer`: what is done with it (registrations, expiry, routes with auto-creation, the admin
  fan-outs, RecallMessage), whatever port a request came in by.
- `namesrv.service`: the gRPC services (MessagingService QueryRoute/RecallMessage for clients,
  rocketraft.internal.v1.NameServer for brokers), conversion only; `namesrv.remoting`: the Remoting door.
- `namesrv.server.NamesrvServer`: the process's ports around the core; `namesrv.config.NamesrvConfig`: its settings.
  Run it with `python -m namesrv --listenPort 9876` (or `-c namesrv.toml`).

See docs/namesrv.md.
"""
