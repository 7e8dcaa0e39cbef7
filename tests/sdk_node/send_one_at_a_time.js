// Sends 1 KiB messages one at a time with the official Node.js SDK until stdin closes; one "send" line per send.
// Usage: node send_one_at_a_time.js <endpoints> <topic>
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const { emit, errorText, logger, run } = require('./lib');

run(async () => {
  const [endpoints, topic] = process.argv.slice(2);
  let stopping = false;
  process.stdin.on('end', () => { stopping = true; });
  process.stdin.resume();
  const producer = new Producer({ endpoints, topics: [topic], requestTimeout: 3000, logger });
  await producer.startup();
  emit('started');
  const body = Buffer.alloc(1024, 'x');
  for (let n = 1; !stopping; n++) {
    try {
      const receipt = await producer.send({ topic, body, keys: [`k${n}`] });
      emit('send', { n, ok: true, id: receipt.messageId });
    } catch (err) {
      emit('send', { n, ok: false, error: errorText(err) });
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
  try {
    await producer.shutdown();  // tells every endpoint, the killed replica too: its refusal does not matter here
  } catch (err) {
    emit('shutdown_error', { error: errorText(err) });
  }
});
