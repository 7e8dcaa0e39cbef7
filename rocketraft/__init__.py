"""rocketraft: a RocketMQ-style message system whose broker groups are Raft groups."""

__version__ = "0.1.0"
