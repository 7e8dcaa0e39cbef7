// Receives with the official Node.js SDK's SimpleConsumer and acknowledges every message, until <count> distinct
// messages arrived or stdin closes; one "received" line per delivery, with the SDK's own `corrupted` verdict.
// A failed receive or ack is reported ("receive_failed", "ack_failed") and the loop goes on: a message whose ack
// failed comes again after its invisible duration.
// Usage: node simple_consume.js <endpoints> <group> <topic> <count> [namespace]
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');
const { emit, logger, view, errorText, stdinClosed, run } = require('./lib');

const INVISIBLE_MS = 15000;
const AWAIT_MS = 2000;

run(async () => {
  const [endpoints, consumerGroup, topic, count, namespace = ''] = process.argv.slice(2);
  let closed = false;
  stdinClosed().then(() => { closed = true; });
  const consumer = new SimpleConsumer({ endpoints, namespace, consumerGroup, subscriptions: new Map([[topic, '*']]),
    awaitDuration: AWAIT_MS, logger });
  await consumer.startup();
  const distinct = new Set();
  while (!closed && distinct.size < Number(count)) {
    let messages = [];
    try {
      messages = await consumer.receive(16, INVISIBLE_MS);
    } catch (err) {
      emit('receive_failed', { error: errorText(err) });
      continue;
    }
    for (const message of messages) {
      emit('received', view(message));
      distinct.add(message.messageId);
      try {
        await consumer.ack(message);
      } catch (err) {
        emit('ack_failed', { id: message.messageId, error: errorText(err) });
      }
    }
  }
});
