"""namesrv: the NameServer. Brokers register their replicas here; clients ask it for routes.

- `namesrv.registry.RouteRegistry`: pure routing logic (which replica is master, which queues a topic has).
- `namesrv.server.NameServer`: the gRPC process around it (MessagingService QueryRoute/RecallMessage for
  clients, rocketraft.internal.v1.NameServer for brokers). Run it with `python -m namesrv --listen HOST:PORT`.

See docs/namesrv.md.
"""
