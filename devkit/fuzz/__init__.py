"""A fuzzer for every RPC of every rocketraft service (docs/fuzzing.md): `python -m devkit.fuzz`.

It starts its own cluster (a NameServer and a 3-replica broker group, real processes), then sends every RPC of
the v2 MessagingService, BrokerAdmin and the internal NameServer service requests of four kinds: valid ones,
valid ones with one field replaced, random messages of the request type, and mutated or random bytes; streams
are opened, fed and dropped. The Remoting ports (RocketMQ 4.x clients) get raw frames for every request code the
NameServer and the brokers serve and for unknown codes (devkit/fuzz/frames.py): valid, with hostile header fields,
flags or bodies, mutated, and malformed on purpose; a malformed frame must close its connection with one WARNING
line, a well-formed one must be answered with a response code and a remark. A server must answer each with success
or a named refusal, within its deadline, and write no traceback; every process must stay up, and the cluster must
still serve a producer and a consumer at the end.
"""
