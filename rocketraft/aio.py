"""rocketraft's asyncio API: the same class and method names as the blocking API in `rocketraft`.

    from rocketraft.aio import Producer, Message
    async with Producer("127.0.0.1:9876") as producer:
        receipt = await producer.send(Message("orders", b"..."))
"""

from rocketraft.client.admin import Admin
from rocketraft.client.config import ClientConfig
from rocketraft.client.consumer import ConsumeResult
from rocketraft.client.message import Message, QueueRef, ReceivedMessage, SendReceipt
from rocketraft.client.producer import BatchSendError, Producer
from rocketraft.client.pull_consumer import PullConsumer
from rocketraft.client.push_consumer import PushConsumer
from rocketraft.client.selection import hash_selector
from rocketraft.client.simple_consumer import SimpleConsumer
from rocketraft.client.transaction import TransactionProducer, TransactionResolution

__all__ = ["Admin", "BatchSendError", "ClientConfig", "ConsumeResult", "Message", "Producer", "PullConsumer",
           "PushConsumer", "QueueRef", "ReceivedMessage", "SendReceipt", "SimpleConsumer", "TransactionProducer",
           "TransactionResolution", "hash_selector"]
