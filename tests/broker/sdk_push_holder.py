"""A PushConsumer of the official Python SDK whose listener never returns: it prints `consumed <message id>
<delivery attempt>` per listener call and holds the message until the process is killed.

    python sdk_push_holder.py <namesrv> <group> <topic>
"""

from __future__ import annotations

import logging
import sys
import threading

from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, PushConsumer


class Holder(MessageListener):
    def consume(self, message):
        print(f"consumed {message.message_id} {message.delivery_attempt}", flush=True)
        threading.Event().wait()  # held until the process dies
        return ConsumeResult.SUCCESS


def main() -> None:
    namesrv, group, topic = sys.argv[1:4]
    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
    consumer = PushConsumer(ClientConfiguration(namesrv, Credentials(), request_timeout=3), group, Holder(),
                            {topic: FilterExpression()})
    consumer.startup()
    print("started", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
