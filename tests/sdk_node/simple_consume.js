// Receives with the official Node.js SDK's SimpleConsumer and acknowledges every message, until <count> arrived
// or stdin closes; one "received" line per message, with the SDK's own `corrupted` verdict.
// Usage: node simple_consume.js <endpoints> <group> <topic> <count>
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');
const { emit, logger, view, errorText, stdinClosed, run } = require('./lib');

const INVISIBLE_MS = 15000;
const AWAIT_MS = 2000;

run(async () => {
  const [endpoints, consumerGroup, topic, count] = process.argv.slice(2);
  let closed = false;
  stdinClosed().then(() => { closed = true; });
  const consumer = new SimpleConsumer({ endpoints, consumerGroup, subscriptions: new Map([[topic, '*']]),
    awaitDuration: AWAIT_MS, logger });
  await consumer.startup();
  let received = 0;
  while (!closed && received < Number(count)) {
    let messages = [];
    try {
      messages = await consumer.receive(16, INVISIBLE_MS);
    } catch (err) {
      emit('receive_failed', { error: errorText(err) });
      continue;
    }
    for (const message of messages) {
      emit('received', view(message));
      received++;
      await consumer.ack(message);
    }
  }
});
