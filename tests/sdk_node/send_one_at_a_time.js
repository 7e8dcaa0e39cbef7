// Sends 1 KiB messages one at a time with the official Node.js SDK until stdin closes; one JSON line per send.
// Usage: node send_one_at_a_time.js <namesrv host:port> <topic>
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic] = process.argv.slice(2);
  let stopping = false;
  process.stdin.on('end', () => { stopping = true; });
  process.stdin.resume();
  const producer = new Producer({ endpoints, topics: [topic], requestTimeout: 3000 });
  await producer.startup();
  console.log(JSON.stringify({ started: true }));
  const body = Buffer.alloc(1024, 'x');
  for (let n = 1; !stopping; n++) {
    try {
      const receipt = await producer.send({ topic, body, keys: [`k${n}`] });
      console.log(JSON.stringify({ n, ok: true, id: receipt.messageId }));
    } catch (err) {
      console.log(JSON.stringify({ n, ok: false, error: String(err && err.message || err).slice(0, 300) }));
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
  try {
    await producer.shutdown();  // tells every endpoint, the killed replica too: its refusal does not matter here
  } catch (err) {
    console.log(JSON.stringify({ shutdown_error: String(err && err.message || err).slice(0, 300) }));
  }
  process.exit(0);
}

main().catch((err) => { console.log(JSON.stringify({ fatal: String(err && err.stack || err) })); process.exit(2); });
