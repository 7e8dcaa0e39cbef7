"""rocketraft's asyncio API: the same class and method names as the blocking API in `rocketraft`.

    from rocketraft.aio import Producer, Message
    async with Producer("127.0.0.1:9876") as producer:
        receipt = await producer.send(Message("orders", b"..."))
"""

from rocketraft.client.admin import Admin
from rocketraft.client.message import Message, QueueRef, ReceivedMessage, SendReceipt
from rocketraft.client.producer import Producer
from rocketraft.client.selection import hash_selector
from rocketraft.client.transaction import TransactionProducer, TransactionResolution

__all__ = ["Admin", "Message", "Producer", "QueueRef", "ReceivedMessage", "SendReceipt", "TransactionProducer",
           "TransactionResolution", "hash_selector"]
