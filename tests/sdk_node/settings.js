// What the official Node.js SDK took from the broker's Telemetry settings: a Producer of <topic> and a PushConsumer
// per <group> are started, then one line each with the raw settings received ("settings_received") and the values
// the SDK synced from them ("producer", "push_consumer"). The producer then tries a body one byte over the
// max body size it was given and a FIFO message to <topic> ("send_refused" or "sent"), and the script exits.
// Usage: node settings.js <endpoints> <topic> <group> [<group> ...]
'use strict';
const { Producer, PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');
const { emit, logger, errorText, run } = require('./lib');

function watchSettings(client, role) {
  const original = client.onSettingsCommand.bind(client);
  client.onSettingsCommand = (endpoints, settings) => {
    emit('settings_received', { role, settings: settings.toObject() });
    return original(endpoints, settings);
  };
}

function policy(retryPolicy) {
  if (!retryPolicy) return null;
  return { kind: retryPolicy.constructor.name, max_attempts: retryPolicy.getMaxAttempts(),
    protobuf: retryPolicy.toProtobuf().toObject() };
}

async function trySend(producer, label, message) {
  try {
    const receipt = await producer.send(message);
    emit('sent', { label, id: receipt.messageId });
  } catch (err) {
    emit('send_refused', { label, error: errorText(err) });
  }
}

run(async () => {
  const [endpoints, topic, ...groups] = process.argv.slice(2);
  const producer = new Producer({ endpoints, topics: [topic], logger });
  watchSettings(producer, 'producer');
  await producer.startup();
  const publishing = producer.publishingSettings;
  emit('producer', { max_body_size: publishing.maxBodySizeBytes,
    validate_message_type: publishing.isValidateMessageType(), retry_policy: policy(publishing.getRetryPolicy()) });
  for (const consumerGroup of groups) {
    const consumer = new PushConsumer({ endpoints, consumerGroup, subscriptions: new Map([[topic, '*']]), logger,
      messageListener: { consume: () => ConsumeResult.SUCCESS } });
    watchSettings(consumer, consumerGroup);
    await consumer.startup();
    const settings = consumer.getPushConsumerSettings();
    emit('push_consumer', { group: consumerGroup, fifo: settings.isFifo(),
      receive_batch_size: settings.getReceiveBatchSize(), long_polling_timeout_ms: settings.getLongPollingTimeout(),
      retry_policy: policy(settings.getRetryPolicy()) });
  }
  await trySend(producer, 'over_max_body', { topic, body: Buffer.alloc(publishing.maxBodySizeBytes + 1, 'x') });
  await trySend(producer, 'fifo', { topic, body: Buffer.from('fifo'), messageGroup: 'g1' });
});
