"""A fuzzer for every RPC of every rocketraft service (docs/fuzzing.md): `python -m devkit.fuzz`.

It starts its own cluster (a NameServer and a 3-replica broker group, real processes), then sends every RPC of
the v2 MessagingService, BrokerAdmin and the internal NameServer service requests of four kinds: valid ones,
valid ones with one field replaced, random messages of the request type, and mutated or random bytes; streams
are opened, fed and dropped. A server must answer each with success or a named refusal, within its deadline,
and write no traceback; every process must stay up, and the cluster must still serve a producer and a consumer
at the end.
"""
