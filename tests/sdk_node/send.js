// Sends the given messages with the official Node.js SDK, one at a time; one "sent" line each (or "send_failed").
// Usage: node send.js <endpoints> <topic> '<JSON list of {body (base64), tag?, keys?, message_group?}>' [namespace]
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const { emit, logger, errorText, run } = require('./lib');

run(async () => {
  const [endpoints, topic, spec, namespace = ''] = process.argv.slice(2);
  const producer = new Producer({ endpoints, namespace, topics: [topic], logger });
  await producer.startup();
  for (const [index, m] of JSON.parse(spec).entries()) {
    const message = { topic, body: Buffer.from(m.body, 'base64'), tag: m.tag, keys: m.keys ?? [],
      messageGroup: m.message_group };
    try {
      const receipt = await producer.send(message);
      emit('sent', { index, id: receipt.messageId });
    } catch (err) {
      emit('send_failed', { index, error: errorText(err) });
    }
  }
});
