// Drives the RocketMQ C++ client (the Remoting protocol) through the Node addon rocketmq-nodejs 1.1.2, installed here
// by `npm ci` (scripts/setup.sh --tests; the package ships the client prebuilt for linux x86_64/aarch64, nothing is
// compiled) for the tests that point real 4.x applications at a NameServer (devkit/remotingdrivers.py runs it as
// "cpp4"). The command line and the events are the Java 4.x driver's (the header of
// tests/remoting_java/src/main/java/rocketraft/remotingjava/Driver.java), for what the addon can do: one JSON line
// per event on stdout ({"event": ..., ...}); every command ends with a "summary" line, stops early when its stdin is
// closed, and prints {"event": "fatal", ...} (exit 1) when it cannot start.
//
//   node driver.js <command> --namesrv host:port [options]
//
//   send --topic T [--count N] [--tag X] [--keys K] [--body B] [--body-size B] [--interval-ms M] [--group G]
//        [--send-timeout-ms M]
//   push --topic T --group G [--tag-expr 'a||b'] [--expect N] [--timeout-s S] [--linger-s S] [--fail-first K]
//        [--max-reconsume-times M]
//
// Options of both: --instance NAME (the client's instance name; default driver-<pid>).
//
// The addon exposes only a producer (send with tags and keys) and a concurrent push consumer (a tag expression; a
// message as topic, tags, keys, body and msgId): an option of the Java driver it cannot honour (--property,
// --delay-level, --sql, --orderly, --broadcast, --batch, --from, --tls, --access-key ...) is refused with a "fatal"
// line rather than ignored. Messages: body "message-{i}" unless --body (padded with "x" or cut to --body-size bytes);
// {i} in --body, --tag and --keys is the message's index.
// Events: sent {index, msgId, queueOffset, status, latencyMs, at, tags, keys}, send_failed {index, class, message,
// latencyMs, at}, started, received {msgId, topic, tags, keys, body, delivery, result, receivedAt}, error, summary.
// `push --fail-first K`: a message's first K deliveries are answered as failed (RECONSUME_LATER); --expect N counts
// distinct messages consumed successfully. The client runs in a child process of the one started (see launch()).
'use strict';

const path = require('node:path');
const { fork } = require('node:child_process');

const ADDON_VERSION = require('rocketmq-nodejs/package.json').version;
const SEND_STATUS = ['SEND_OK', 'FLUSH_DISK_TIMEOUT', 'FLUSH_SLAVE_TIMEOUT', 'SLAVE_NOT_AVAILABLE'];
const OPTIONS = {
  send: ['namesrv', 'instance', 'topic', 'count', 'tag', 'keys', 'body', 'body-size', 'interval-ms', 'group',
    'send-timeout-ms'],
  push: ['namesrv', 'instance', 'topic', 'group', 'tag-expr', 'expect', 'timeout-s', 'linger-s', 'fail-first',
    'max-reconsume-times'],
};

function emit(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

// Exits once everything written to stdout has left (process.exit() at once may drop a queued line), telling the
// launcher first (see launch()).
function exit(status) {
  process.stdout.write('', () => {
    if (process.send) process.send({ status }, () => process.exit(status));
    else process.exit(status);
  });
}

// The client runs in a child process of this one, which loads no addon: the C++ client's exit can hang for good
// (exit() runs rocketmq::EventLoop's destructor, which joins its libevent thread while that thread waits in
// epoll_wait with no timeout and nothing wakes it; seen after a push consumer's clean shutdown). So once the child
// has flushed its last line and said its status, it is given EXIT_GRACE_MS to exit, then killed; this process exits
// with the status the child said (1, with a "fatal" line, if it died without saying one).
const EXIT_GRACE_MS = 1500;

function launch() {
  const child = fork(__filename, process.argv.slice(2), {
    stdio: ['inherit', 'inherit', 'inherit', 'ipc'], env: { ...process.env, CPP4_DRIVER_CHILD: '1' },
  });
  let said;
  child.on('message', (m) => {
    said = m.status;
    setTimeout(() => child.kill('SIGKILL'), EXIT_GRACE_MS).unref();
  });
  child.on('exit', (code, signal) => {
    if (said === undefined) {
      emit('fatal', { class: 'ChildExit', message: `the client's process exited (${code ?? signal}) before its end` });
      process.exit(1);
    }
    process.exit(said);
  });
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => child.kill('SIGKILL'));
}

function error(err) {
  return {
    class: (err && err.constructor && err.constructor.name) || 'Error',
    message: String((err && err.message) || err).slice(0, 1000),
  };
}

function parse(argv) {
  const [command, ...rest] = argv;
  if (!OPTIONS[command]) {
    throw new Error(`unknown command ${command} (rocketmq-nodejs ${ADDON_VERSION} drives only send and push)`);
  }
  const args = {};
  for (let i = 0; i < rest.length; i++) {
    if (!rest[i].startsWith('--')) throw new Error(`unexpected argument ${rest[i]}`);
    const name = rest[i].slice(2);
    if (!OPTIONS[command].includes(name)) {
      throw new Error(`--${name} is not supported: rocketmq-nodejs ${ADDON_VERSION} offers ${command} only with `
        + OPTIONS[command].map((o) => `--${o}`).join(' '));
    }
    if (i + 1 < rest.length) {
      args[name] = rest[++i];
    } else {
      throw new Error(`--${name} needs a value`);
    }
  }
  if (!args.namesrv) throw new Error('--namesrv is required');
  return { command, args };
}

function required(args, name) {
  if (args[name] === undefined) throw new Error(`--${name} is required`);
  return args[name];
}

function number(args, name, fallback) {
  if (args[name] === undefined) return fallback;
  const n = Number(args[name]);
  if (!Number.isFinite(n)) throw new Error(`--${name} must be a number, not ${args[name]}`);
  return n;
}

const indexed = (template, i) => (template === undefined ? undefined : template.split('{i}').join(String(i)));

// The client's settings: the NameServer, an instance name of its own, its log (under rocketmq.client.logRoot, which
// devkit/sdkdrivers.py sets, at warn; the addon's logDir names the log file itself, and a directory there aborts
// the process with "initialite logger failed").
function settings(args) {
  const logRoot = process.env['rocketmq.client.logRoot'];
  return [args.instance || `driver-${process.pid}`, {
    nameServer: args.namesrv,
    logLevel: 'warn',
    ...(logRoot ? { logDir: path.join(logRoot, 'rocketmq_client_cpp.log') } : {}), // a file: a directory aborts
  }];
}

let stdinClosed = false;
const stdinWaiters = [];

function watchStdin() {
  process.stdin.on('end', () => {
    stdinClosed = true;
    stdinWaiters.splice(0).forEach((wake) => wake());
  });
  process.stdin.on('error', () => process.stdin.emit('end'));
  process.stdin.resume();
}

// Waits `ms` (forever when negative), returning early (true) when stdin is closed.
function pause(ms) {
  if (stdinClosed) return Promise.resolve(true);
  return new Promise((resolve) => {
    const wake = () => { clearTimeout(timer); resolve(true); };
    const timer = ms < 0 ? undefined : setTimeout(() => {
      const at = stdinWaiters.indexOf(wake);
      if (at >= 0) stdinWaiters.splice(at, 1);
      resolve(false);
    }, ms);
    stdinWaiters.push(wake);
  });
}

function body(args, i) {
  let text = indexed(args.body ?? 'message-{i}', i);
  if (args['body-size'] !== undefined) {
    const size = number(args, 'body-size', 0);
    text = text.length > size ? text.slice(0, size) : text + 'x'.repeat(size - text.length);
  }
  return text;
}

async function send(args) {
  const topic = required(args, 'topic');
  const [instance, options] = settings(args);
  if (args['send-timeout-ms'] !== undefined) options.sendMessageTimeout = number(args, 'send-timeout-ms', 3000);
  const producer = new Producer(args.group || 'cpp4-driver-producer', instance, options);
  await producer.start();
  const count = number(args, 'count', 1);
  const interval = number(args, 'interval-ms', 0);
  const started = process.hrtime.bigint();
  let sent = 0;
  let failed = 0;
  for (let i = 0; i < count && !stdinClosed; i++) {
    const message = { tags: indexed(args.tag, i), keys: indexed(args.keys, i) };
    for (const k of Object.keys(message)) if (message[k] === undefined) delete message[k];
    const t0 = process.hrtime.bigint();
    const latencyMs = () => Number(process.hrtime.bigint() - t0) / 1e6;
    try {
      const r = await producer.send(topic, body(args, i), message);
      emit('sent', {
        index: i, msgId: r.msgId, queueOffset: r.offset, status: SEND_STATUS[r.status] ?? String(r.status),
        latencyMs: latencyMs(), at: Date.now(), tags: message.tags ?? null, keys: message.keys ?? null,
      });
      sent++;
    } catch (err) {
      emit('send_failed', { index: i, ...error(err), latencyMs: latencyMs(), at: Date.now() });
      failed++;
    }
    if (interval > 0 && await pause(interval)) break;
  }
  await producer.shutdown();
  emit('summary', { command: 'send', sent, failed, elapsedMs: Number(process.hrtime.bigint() - started) / 1e6 });
}

async function push(args) {
  const topic = required(args, 'topic');
  const group = required(args, 'group');
  const [instance, options] = settings(args);
  if (args['max-reconsume-times'] !== undefined) {
    options.maxReconsumeTimes = number(args, 'max-reconsume-times', 16);
  }
  const failFirst = number(args, 'fail-first', 0);
  const expect = number(args, 'expect', -1);
  const deliveries = new Map();
  const consumed = new Set();
  let received = 0;
  let duplicates = 0;
  let done;
  const complete = new Promise((resolve) => { done = resolve; });
  const consumer = new PushConsumer(group, instance, options);
  consumer.subscribe(topic, args['tag-expr'] || '*');
  consumer.on('message', (m, ack) => {
    const delivery = (deliveries.get(m.msgId) || 0) + 1;
    deliveries.set(m.msgId, delivery);
    const ok = delivery > failFirst;
    received++;
    emit('received', {
      msgId: m.msgId, topic: m.topic, tags: m.tags || null, keys: m.keys || null, body: m.body, delivery,
      result: ok ? 'consumed' : 'failed', receivedAt: Date.now(),
    });
    if (ok) {
      if (consumed.has(m.msgId)) duplicates++;
      consumed.add(m.msgId);
      if (expect >= 0 && consumed.size >= expect) done();
    }
    ack.done(ok);
  });
  consumer.on('error', (err) => emit('error', { op: 'listener', ...error(err) }));
  await consumer.start();
  emit('started', { command: 'push', group });
  // Until --expect messages were consumed, --timeout-s passed or stdin was closed; then --linger-s more.
  const timeoutMs = args['timeout-s'] === undefined ? -1 : number(args, 'timeout-s', 0) * 1000;
  await Promise.race([complete, pause(timeoutMs)]);
  await pause(number(args, 'linger-s', 0) * 1000);
  await consumer.shutdown();
  emit('summary', {
    command: 'push', received, distinct: deliveries.size, consumed: consumed.size, duplicates,
    complete: expect < 0 || consumed.size >= expect,
  });
}

async function main() {
  let status = 0;
  try {
    const { command, args } = parse(process.argv.slice(2));
    watchStdin();
    await (command === 'send' ? send(args) : push(args));
  } catch (err) {
    emit('fatal', error(err));
    status = 1;
  }
  exit(status);
}

let Producer;
let PushConsumer;
if (process.env.CPP4_DRIVER_CHILD) {
  // a launcher that went away (killed by a test's teardown) takes the client with it, at once (see launch())
  process.on('disconnect', () => process.kill(process.pid, 'SIGKILL'));
  ({ Producer, PushConsumer } = require('rocketmq-nodejs'));
  main();
} else {
  launch();
}
