"""broker: one replica of a broker group (a Raft group), with a RocketMQ 5 gRPC front door; docs/broker.md.

  server.py       the process: gRPC server, NameServer registration, the master's timers
  service.py      gRPC conversion only (MessagingService, BrokerAdmin)
  validation.py   the door: every request checked before Raft
  core.py         Broker: the dledger replica and state machine, the batcher, the write guards, events
  topics.py, writes.py, consume.py, queries.py    the jobs the service calls
  reads.py        reading stored messages and queue positions
  batcher.py      group commit; errors.py the one mapping to protocol errors; guards.py disk and LMDB map
  statemachine.py, tables.py    what applying a committed entry does to the broker's LMDB tables: the one entry
                  point; its parts by command family: apply_messages.py (sends, key indexes, recalls),
                  apply_pending.py (delay timers, transactions), apply_consume.py (pops, receipt handles, offsets),
                  apply_topics.py (topic and group configs), attempts.py (idempotent receive attempts), expiry.py
                  (retention's deletions); apply_state.py what they share, apply_results.py their results
  remoting.py     the Remoting door (RocketMQ 4.x clients): conversion only, as service.py; its request families:
                  remoting_sessions.py (heartbeats, sessions, group members, check-backs), remoting_messages.py
                  (send, pull, send-back, end of a transaction), remoting_offsets.py (offsets, queue locks),
                  remoting_admin.py (mqadmin, message queries); remoting_table.py the request codes,
                  remoting_door.py what the families share, remoting_fields.py reading a request's fields
  clients.py, outboxes.py, checkbacks.py, renewal.py    client sessions and their streams: Telemetry settings,
                  bounded outboxes, transaction check-backs, push consumers' auto-renewal
  retention.py    the master's retention timer; auth_service.py, auth_store.py ACL 2.0 users and policies
  config.py       the typed configuration; metrics.py, traffic.py    Prometheus metrics and what the doors count
"""
