// Sends <count> messages to <topic> in <namespace> with the official Node.js SDK, then receives them with a
// SimpleConsumer of <group> in the same namespace; prints one JSON line: what was received.
// Usage: node namespace_roundtrip.js <namesrv host:port> <namespace> <topic> <group> <count>
'use strict';
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');

const RECEIVE_FOR_MS = 20000;

async function main() {
  const [endpoints, namespace, topic, group, countText] = process.argv.slice(2);
  const count = Number(countText);
  const producer = new Producer({ endpoints, namespace, topics: [topic], requestTimeout: 3000 });
  await producer.startup();
  for (let i = 0; i < count; i++) {
    await producer.send({ topic, body: Buffer.from(`${namespace}-${i}`) });
  }
  await producer.shutdown();
  const consumer = new SimpleConsumer({ endpoints, namespace, consumerGroup: group, requestTimeout: 3000,
    subscriptions: new Map([[topic, FilterExpression.SUB_ALL]]), awaitDuration: 2000 });
  await consumer.startup();
  const received = [];
  const deadline = Date.now() + RECEIVE_FOR_MS;
  while (received.length < count && Date.now() < deadline) {
    for (const message of await consumer.receive(16, 15000)) {
      received.push({ body: message.body.toString(), topic: message.topic });
      await consumer.ack(message);
    }
  }
  const more = await consumer.receive(16, 15000);  // nothing else is in this namespace's topic
  await consumer.shutdown();
  console.log(JSON.stringify({ received, more: more.length }));
  process.exit(0);
}

main().catch((err) => { console.log(JSON.stringify({ fatal: String(err && err.stack || err) })); process.exit(2); });
