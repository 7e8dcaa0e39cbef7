"""rocketraft: a RocketMQ-style message system whose broker groups are Raft groups.

Blocking client API (the asyncio API with the same names is `rocketraft.aio`):

    import rocketraft
    with rocketraft.Producer("127.0.0.1:9876") as producer:
        producer.send(rocketraft.Message("orders", b"..."))
"""

__version__ = "0.1.0"

# Imported on first use: servers import `rocketraft.protocol.wire` and must not pay for the client.
_EXPORTS = {
    "Producer": "rocketraft.client.api", "TransactionProducer": "rocketraft.client.api",
    "Admin": "rocketraft.client.api", "SimpleConsumer": "rocketraft.client.api",
    "PullConsumer": "rocketraft.client.api", "PushConsumer": "rocketraft.client.api",
    "ConsumeResult": "rocketraft.client.consumer", "Sql92": "rocketraft.client.consumer",
    "BatchSendError": "rocketraft.client.producer", "ClientConfig": "rocketraft.client.config",
    "Message": "rocketraft.client.message", "QueueRef": "rocketraft.client.message",
    "ReceivedMessage": "rocketraft.client.message", "SendReceipt": "rocketraft.client.message",
    "TransactionResolution": "rocketraft.client.transaction", "hash_selector": "rocketraft.client.selection",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rocketraft' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
