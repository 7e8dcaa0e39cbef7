// A transactional Producer of the official Node.js SDK that sends one half message per key given and leaves each
// open (neither commit nor rollback), then answers the broker's check-backs until stdin closes: its checker
// commits a message whose first key is "commit" and rolls back one whose first key is "rollback".
// Lines: "half" per message sent, "check" per check-back, "end" per EndTransaction the SDK sends for it.
// Usage: node transaction_check.js <endpoints> <topic> <key> [<key> ...]
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
// not exported by the SDK's index: its own transaction example imports them from here
const { TransactionResolution, TransactionSource } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb.js');
const { emit, logger, probe, stdinClosed, run } = require('./lib');

const RESOLUTIONS = { commit: TransactionResolution.COMMIT, rollback: TransactionResolution.ROLLBACK };

run(async () => {
  const [endpoints, topic, ...keys] = process.argv.slice(2);
  const checker = {
    async check(message) {
      const key = message.keys[0];
      emit('check', { id: message.messageId, key, corrupted: message.corrupted === true });
      return RESOLUTIONS[key];
    },
  };
  const producer = new Producer({ endpoints, topics: [topic], checker, logger });
  probe(producer, 'endTransaction', 'end', ([, , messageId, , resolution, source]) => ({
    id: messageId, resolution: resolution === TransactionResolution.COMMIT ? 'COMMIT' : 'ROLLBACK',
    from_check: source === TransactionSource.SOURCE_SERVER_CHECK }));
  await producer.startup();
  for (const key of keys) {
    const transaction = producer.beginTransaction();
    const receipt = await producer.send({ topic, body: Buffer.from(`half ${key}`), keys: [key] }, transaction);
    emit('half', { id: receipt.messageId, key });
  }
  await stdinClosed();
});
