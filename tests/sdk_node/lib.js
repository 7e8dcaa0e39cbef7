// What the test scripts share: one JSON line per event on stdout (read by conftest.NodeScript), the SDK's warnings
// and errors on stderr (kept in a file for a failing test's message), and a run that lasts until the test closes
// stdin. Probes wrap SDK methods to report their outcome and change nothing else.
'use strict';
const util = require('node:util');

function emit(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

const logger = {
  info() {},
  debug() {},
  warn(...args) { process.stderr.write(`WARN ${util.format(...args)}\n`); },
  error(...args) { process.stderr.write(`ERROR ${util.format(...args)}\n`); },
  close() {},
};

function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.resume();
  });
}

// A received message as the test compares it; the body in base64, `corrupted` as the SDK decided it.
function view(message) {
  return {
    id: message.messageId,
    topic: message.topic,
    tag: message.tag ?? null,
    message_group: message.messageGroup ?? null,
    keys: message.keys,
    body: message.body.toString('base64'),
    corrupted: message.corrupted === true,
    attempt: message.deliveryAttempt ?? null,
  };
}

function errorText(err) {
  return String((err && err.message) || err).slice(0, 500);
}

// Wraps obj[name] (an async method) to emit `event` with what report(args, result) returns; the call is unchanged.
function probe(obj, name, event, report) {
  const original = obj[name].bind(obj);
  obj[name] = async (...args) => {
    try {
      const result = await original(...args);
      emit(event, report(args, result));
      return result;
    } catch (err) {
      emit(event, { ...report(args, undefined), error: errorText(err) });
      throw err;
    }
  };
}

// Exits once everything written to stdout has left: process.exit() at once dropped the end of a line longer than
// the pipe's buffer (a 60 KB body, base64) that was still queued, and the reader lost that event.
function exitAfterOutput(code) {
  process.stdout.write('', () => process.exit(code));
}

function run(main) {
  main().then(() => exitAfterOutput(0), (err) => {
    emit('fatal', { error: String((err && err.stack) || err) });
    exitAfterOutput(2);
  });
}

module.exports = { emit, logger, stdinClosed, view, errorText, probe, run };
