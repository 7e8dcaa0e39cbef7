// A PushConsumer of the official Node.js SDK until stdin closes. Its listener answers by <behaviour>:
//   ok          SUCCESS
//   later-once  FAILURE ("consume later") at a message's first delivery attempt, SUCCESS after
//   fail        FAILURE every time
//   slow-<ms>   SUCCESS after <ms> milliseconds (a listener that outlasts the message's invisibility)
// Lines: "consume" per listener call (the message and the answer); "ack", "change_invisible" and "dead_letter"
// per call the SDK makes for a result, with the broker's status code (or the error).
// Usage: node push_consume.js <endpoints> <group> <topic> <behaviour>
'use strict';
const { PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');
const { emit, logger, view, probe, stdinClosed, run } = require('./lib');

async function answer(behaviour, message) {
  if (behaviour.startsWith('slow-')) {
    await new Promise((resolve) => { setTimeout(resolve, Number(behaviour.slice('slow-'.length))); });
    return ConsumeResult.SUCCESS;
  }
  if (behaviour === 'ok') return ConsumeResult.SUCCESS;
  if (behaviour === 'later-once') return message.deliveryAttempt > 1 ? ConsumeResult.SUCCESS : ConsumeResult.FAILURE;
  if (behaviour === 'fail') return ConsumeResult.FAILURE;
  throw new Error(`unknown behaviour ${behaviour}`);
}

function code(response) {
  return response ? response.getStatus().getCode() : null;
}

run(async () => {
  const [endpoints, consumerGroup, topic, behaviour] = process.argv.slice(2);
  const messageListener = {
    async consume(message) {
      const at_ms = Date.now();
      const result = await answer(behaviour, message);
      emit('consume', { ...view(message), result: result.toString(), at_ms });
      return result;
    },
  };
  const consumer = new PushConsumer({ endpoints, consumerGroup, subscriptions: new Map([[topic, '*']]),
    messageListener, logger });
  probe(consumer, 'ackMessageViaRpc', 'ack', ([, request], response) => ({
    id: request.getEntriesList()[0].getMessageId(), code: code(response) }));
  probe(consumer, 'changeInvisibleDurationViaRpc', 'change_invisible', ([, request], response) => {
    const duration = request.getInvisibleDuration();
    return { id: request.getMessageId(), code: code(response),
      duration_ms: duration.getSeconds() * 1000 + Math.floor(duration.getNanos() / 1e6) };
  });
  probe(consumer, 'forwardMessageToDeadLetterQueueViaRpc', 'dead_letter', ([, request], response) => ({
    id: request.getMessageId(), code: code(response), attempt: request.getDeliveryAttempt(),
    max_attempts: request.getMaxDeliveryAttempts() }));
  await consumer.startup();
  emit('started', { fifo: consumer.getPushConsumerSettings().isFifo() });
  await stdinClosed();
});
