// Drives the RocketMQ 4.x Java client (rocketmq-client 4.9.8, the Remoting protocol) for the tests that point real
// 4.x applications at a NameServer (devkit/remotingdrivers.py runs it): one JSON line per event on stdout
// ({"event": ..., ...}), the client's own log under -Drocketmq.client.logRoot; every command ends with a "summary"
// line, stops early when its stdin is closed, and prints {"event": "fatal", ...} (exit 1) when it cannot start.
//
//   java -jar target/remoting-java-driver.jar <command> --namesrv host:port [options]
//
//   send --topic T [--count N] [--tag X] [--keys K] [--property k=v]... [--delay-level L] [--body B]
//        [--body-size B] [--batch K] [--orderly-key-count K] [--interval-ms M] [--duration-s S] [--group G]
//        [--retries R] [--send-timeout-ms M]
//   transaction --topic T [--count N] --resolve commit|rollback|unknown-then-commit [--check-answer commit|rollback]
//        [--timeout-s S] [--linger-s S] [--group G]   (+ the message options of send)
//   push --topic T --group G [--tag-expr 'a||b' | --sql 'a > 1'] [--orderly] [--broadcast] [--expect N]
//        [--timeout-s S] [--linger-s S] [--fail-first K] [--retry-delay-level L] [--max-reconsume-times M]
//        [--from first|last]
//   pull --topic T --group G [--tag-expr E | --sql S] [--expect N] [--timeout-s S] [--from first|last]
//   admin-route --topic T          admin-cluster
//   query-id --topic T --msg-id X  query-key --topic T --key K
//   serve --topic T --group G [--role producer|consumer|both] [--threads N] [--producer-group P] [--from first|last]
//
// `serve` (the chaos runs' "remoting" workload, jepsen_tests/workloads.py) starts one DefaultMQProducer and/or one
// DefaultLitePullConsumer (subscribe mode, manual commit), prints {"event": "started", ...}, then reads one JSON
// request per stdin line and answers each with one {"event": "answer", "req": <its req>, "ok": true|false, ...} line;
// requests run on a pool of --threads (default 8), so answers may come in any order. Until stdin closes:
//   {"req": 1, "op": "send", "id": "p1-7", "group": "g3"}   body and key = id, the message group as __SHARDINGKEY;
//        a plain synchronous send(msg) with the client's default retries (2) and timeout (3 s). Answers msgId,
//        offsetMsgId, brokerName, queueId, queueOffset, status, and `attempts`: one entry per attempt that reached
//        the wire (the SendMessageHook sees each), {broker, brokerName, queueId, ok, class?, code?}; a failure also
//        class, message, code of the exception send() threw (which describes only the last attempt).
//   {"req": 2, "op": "poll", "timeoutMs": 2000, "max": 64}  what the consumer has: poll(timeoutMs) once, then
//        poll(0) until nothing more or max; answers messages [{id, group, msgId, brokerName, queueId, queueOffset,
//        reconsumeTimes}] in the order poll returned them.
//   {"req": 3, "op": "commit"}  commitSync(): everything polled so far is consumed (the caller recorded it).
//
// Options of every command: --access-key/--secret-key (ACL 1.0: rocketmq-acl's AclClientRPCHook signs each
// request), --tls (the client's TLS mode: -Dtls.enable=true and ClientConfig.useTLS), --poll-namesrv-ms M (how often
// the client refreshes routes; the client's default is 30 s), --instance NAME, --offset-store-dir D (where a
// broadcasting consumer keeps its offsets; default: a new temporary directory, so no two runs share them).
//
// Messages: body "message-{i}" unless --body (padded with "x" or cut to --body-size bytes); {i} in --body, --tag,
// --keys and property values is the message's index; every message carries the property seq=<index> (and orderKey
// with --orderly-key-count: key-<index % K>, the queue chosen by the key's String.hashCode modulo the queue count).
// Events: sent {index, msgId, offsetMsgId, brokerName, queueId, queueOffset, status, latencyMs, at, ...},
// send_failed {index, class, message, code?, latencyMs}, received {msgId, topic, tags, keys, body, properties,
// queueId, queueOffset, reconsumeTimes, bornTimestamp, storeTimestamp, brokerName, delivery, result, receivedAt},
// checked {msgId, transactionId, answer, ...}, route, cluster, found, error {op, class, message, code?}, summary.
// `push --fail-first K`: a message's first K deliveries answer RECONSUME_LATER (orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT);
// --expect N counts distinct messages consumed successfully.
package rocketraft.remotingjava;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.hook.SendMessageContext;
import org.apache.rocketmq.client.hook.SendMessageHook;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.QueueData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public final class Driver {
    private static final Gson GSON = new GsonBuilder().disableHtmlEscaping().serializeNulls().create();
    private static final CountDownLatch STDIN_CLOSED = new CountDownLatch(1);
    private static final AtomicInteger INSTANCES = new AtomicInteger();

    private Driver() {
    }

    // ---- output ----

    static synchronized void emit(String event, Map<String, Object> fields) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("event", event);
        line.putAll(fields);
        System.out.println(GSON.toJson(line));
        System.out.flush();
    }

    static Map<String, Object> fields(Object... pairs) {
        Map<String, Object> map = new LinkedHashMap<>();
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            map.put((String) pairs[i], pairs[i + 1]);
        }
        return map;
    }

    // class, message (the exception and its causes, at most 1,000 characters) and the Remoting response code.
    static Map<String, Object> error(Throwable t) {
        StringBuilder text = new StringBuilder();
        for (Throwable c = t; c != null && text.length() < 1000; c = c.getCause() == c ? null : c.getCause()) {
            text.append(text.length() == 0 ? "" : " <- ").append(c.getClass().getSimpleName()).append(": ")
                .append(c.getMessage());
        }
        Map<String, Object> f = fields("class", t.getClass().getName(),
            "message", text.length() > 1000 ? text.substring(0, 1000) : text.toString());
        if (t instanceof MQClientException) {
            f.put("code", ((MQClientException) t).getResponseCode());
        } else if (t instanceof MQBrokerException) {
            f.put("code", ((MQBrokerException) t).getResponseCode());
        }
        return f;
    }

    // ---- arguments ----

    static final class Args {
        final Map<String, List<String>> values = new HashMap<>();

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 1; i < argv.length; i++) {
                if (!argv[i].startsWith("--")) {
                    throw new IllegalArgumentException("unexpected argument " + argv[i]);
                }
                String name = argv[i].substring(2);
                String value = "true";
                if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                    value = argv[++i];
                }
                a.values.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
            }
            return a;
        }

        boolean has(String name) {
            return values.containsKey(name);
        }

        String get(String name, String otherwise) {
            List<String> v = values.get(name);
            return v == null ? otherwise : v.get(v.size() - 1);
        }

        String required(String name) {
            String v = get(name, null);
            if (v == null) {
                throw new IllegalArgumentException("--" + name + " is required");
            }
            return v;
        }

        List<String> all(String name) {
            return values.getOrDefault(name, List.of());
        }

        int integer(String name, int otherwise) {
            return Integer.parseInt(get(name, String.valueOf(otherwise)));
        }

        double number(String name, double otherwise) {
            return Double.parseDouble(get(name, String.valueOf(otherwise)));
        }
    }

    // ---- the client's settings ----

    static RPCHook hook(Args a) {
        String accessKey = a.get("access-key", "");
        return accessKey.isEmpty() ? null
            : new AclClientRPCHook(new SessionCredentials(accessKey, a.get("secret-key", "")));
    }

    static <T extends ClientConfig> T configure(T client, Args a) {
        client.setNamesrvAddr(a.required("namesrv"));
        client.setVipChannelEnabled(false);
        client.setUseTLS(a.has("tls"));
        client.setInstanceName(a.get("instance", "driver-" + ProcessHandle.current().pid() + "-"
            + INSTANCES.incrementAndGet()));
        if (a.has("poll-namesrv-ms")) {
            client.setPollNameServerInterval(a.integer("poll-namesrv-ms", 30000));
        }
        return client;
    }

    static ConsumeFromWhere from(Args a) {
        return a.get("from", "first").equals("last") ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET;
    }

    // Waits at most `ms` (forever when negative), returning early when stdin is closed; true if it was.
    static boolean pause(long ms) throws InterruptedException {
        if (ms < 0) {
            STDIN_CLOSED.await();
            return true;
        }
        return STDIN_CLOSED.await(ms, TimeUnit.MILLISECONDS);
    }

    static boolean stopped() {
        return STDIN_CLOSED.getCount() == 0;
    }

    // ---- messages ----

    static String indexed(String template, int index) {
        return template == null ? null : template.replace("{i}", String.valueOf(index));
    }

    static Message message(Args a, String topic, int index, String orderKey) {
        String body = indexed(a.get("body", "message-{i}"), index);
        if (a.has("body-size")) {
            int size = a.integer("body-size", 0);
            StringBuilder b = new StringBuilder(body.length() > size ? body.substring(0, size) : body);
            while (b.length() < size) {
                b.append('x');
            }
            body = b.toString();
        }
        Message m = new Message(topic, body.getBytes(StandardCharsets.UTF_8));
        String tag = indexed(a.get("tag", null), index);
        if (tag != null) {
            m.setTags(tag);
        }
        String keys = indexed(a.get("keys", null), index);
        if (keys != null) {
            m.setKeys(keys);
        }
        for (String property : a.all("property")) {
            int eq = property.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("--property wants k=v, not " + property);
            }
            m.putUserProperty(property.substring(0, eq), indexed(property.substring(eq + 1), index));
        }
        m.putUserProperty("seq", String.valueOf(index));
        if (orderKey != null) {
            m.putUserProperty("orderKey", orderKey);
        }
        if (a.has("delay-level")) {
            m.setDelayTimeLevel(a.integer("delay-level", 0));
        }
        return m;
    }

    static Map<String, Object> receipt(int index, Message m, SendResult r, long latencyNs) {
        Map<String, Object> f = fields("index", index, "msgId", r.getMsgId(), "offsetMsgId", r.getOffsetMsgId(),
            "brokerName", r.getMessageQueue().getBrokerName(), "queueId", r.getMessageQueue().getQueueId(),
            "queueOffset", r.getQueueOffset(), "status", r.getSendStatus().name(),
            "latencyMs", latencyNs / 1e6, "at", System.currentTimeMillis(), "tags", m.getTags(), "keys", m.getKeys());
        if (m.getProperty("orderKey") != null) {
            f.put("orderKey", m.getProperty("orderKey"));
        }
        if (r.getTransactionId() != null) {
            f.put("transactionId", r.getTransactionId());
        }
        if (r instanceof TransactionSendResult && ((TransactionSendResult) r).getLocalTransactionState() != null) {
            f.put("localState", ((TransactionSendResult) r).getLocalTransactionState().name());
        }
        return f;
    }

    // A message as a consumer or a query sees it: every field MessageExt has.
    static Map<String, Object> view(MessageExt m) {
        Map<String, Object> f = fields("msgId", m.getMsgId(),
            "offsetMsgId", m instanceof MessageClientExt ? ((MessageClientExt) m).getOffsetMsgId() : m.getMsgId(),
            "topic", m.getTopic(), "tags", m.getTags(), "keys", m.getKeys(),
            "body", m.getBody() == null ? null : new String(m.getBody(), StandardCharsets.UTF_8),
            "bodySize", m.getBody() == null ? 0 : m.getBody().length,
            "properties", new TreeMap<>(m.getProperties()), "queueId", m.getQueueId(),
            "queueOffset", m.getQueueOffset(), "reconsumeTimes", m.getReconsumeTimes(),
            "bornTimestamp", m.getBornTimestamp(), "storeTimestamp", m.getStoreTimestamp(),
            "brokerName", m.getBrokerName(), "bornHost", m.getBornHostString(),
            "storeHost", String.valueOf(m.getStoreHost()), "commitLogOffset", m.getCommitLogOffset(),
            "sysFlag", m.getSysFlag(), "delayLevel", m.getDelayTimeLevel());
        if (m.getTransactionId() != null) {
            f.put("transactionId", m.getTransactionId());
        }
        f.put("receivedAt", System.currentTimeMillis());
        return f;
    }

    // ---- send ----

    static final MessageQueueSelector BY_KEY_HASH = (queues, message, key) ->
        queues.get(Math.floorMod(key.hashCode(), queues.size()));

    static void send(Args a) throws Exception {
        String topic = a.required("topic");
        DefaultMQProducer producer = configure(new DefaultMQProducer(a.get("group", "rocketraft-driver-producer"),
            hook(a)), a);
        if (a.has("retries")) {
            producer.setRetryTimesWhenSendFailed(a.integer("retries", 2));
        }
        if (a.has("send-timeout-ms")) {
            producer.setSendMsgTimeout(a.integer("send-timeout-ms", 3000));
        }
        producer.start();
        boolean timed = a.has("duration-s");
        int count = a.integer("count", timed ? Integer.MAX_VALUE : 1);
        long deadline = timed ? System.nanoTime() + (long) (a.number("duration-s", 0) * 1e9) : Long.MAX_VALUE;
        int batch = Math.max(1, a.integer("batch", 1));
        int orderKeys = a.integer("orderly-key-count", 0);
        long interval = a.integer("interval-ms", 0);
        long started = System.nanoTime();
        int sent = 0;
        int failed = 0;
        int index = 0;
        while (index < count && System.nanoTime() < deadline && !stopped()) {
            int n = Math.min(batch, count - index);
            List<Message> messages = new ArrayList<>();
            for (int j = 0; j < n; j++) {
                String orderKey = orderKeys > 0 ? "key-" + ((index + j) % orderKeys) : null;
                messages.add(message(a, topic, index + j, orderKey));
            }
            long t0 = System.nanoTime();
            try {
                if (batch > 1) {
                    SendResult r = producer.send(messages);
                    long latency = System.nanoTime() - t0;
                    String[] ids = r.getMsgId() == null ? new String[0] : r.getMsgId().split(",");
                    String[] offsetIds = r.getOffsetMsgId() == null ? new String[0] : r.getOffsetMsgId().split(",");
                    for (int j = 0; j < n; j++) {
                        Map<String, Object> f = receipt(index + j, messages.get(j), r, latency);
                        f.put("msgId", j < ids.length ? ids[j] : null);
                        f.put("offsetMsgId", j < offsetIds.length ? offsetIds[j] : null);
                        f.put("queueOffset", r.getQueueOffset() + j);
                        f.put("batch", n);
                        emit("sent", f);
                    }
                } else if (orderKeys > 0) {
                    Message m = messages.get(0);
                    SendResult r = producer.send(m, BY_KEY_HASH, m.getProperty("orderKey"));
                    emit("sent", receipt(index, m, r, System.nanoTime() - t0));
                } else {
                    SendResult r = producer.send(messages.get(0));
                    emit("sent", receipt(index, messages.get(0), r, System.nanoTime() - t0));
                }
                sent += n;
            } catch (Exception e) {
                long latency = System.nanoTime() - t0;
                for (int j = 0; j < n; j++) {
                    Map<String, Object> f = fields("index", index + j);
                    f.putAll(error(e));
                    f.put("latencyMs", latency / 1e6);
                    f.put("at", System.currentTimeMillis());
                    emit("send_failed", f);
                }
                failed += n;
            }
            index += n;
            if (interval > 0 && pause(interval)) {
                break;
            }
        }
        producer.shutdown();
        emit("summary", fields("command", "send", "sent", sent, "failed", failed,
            "elapsedMs", (System.nanoTime() - started) / 1e6));
    }

    // ---- transaction ----

    static void transaction(Args a) throws Exception {
        String topic = a.required("topic");
        String resolve = a.required("resolve");
        LocalTransactionState local;
        switch (resolve) {
            case "commit": local = LocalTransactionState.COMMIT_MESSAGE; break;
            case "rollback": local = LocalTransactionState.ROLLBACK_MESSAGE; break;
            case "unknown-then-commit": local = LocalTransactionState.UNKNOW; break;
            default: throw new IllegalArgumentException("--resolve commit|rollback|unknown-then-commit");
        }
        LocalTransactionState answer = a.get("check-answer", "commit").equals("rollback")
            ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.COMMIT_MESSAGE;
        Set<String> checked = ConcurrentHashMap.newKeySet();
        TransactionMQProducer producer = configure(new TransactionMQProducer(
            a.get("group", "rocketraft-driver-transactions"), hook(a)), a);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message message, Object arg) {
                return local;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt message) {
                String id = MessageClientIDSetter.getUniqID(message);
                checked.add(id == null ? message.getMsgId() : id);
                Map<String, Object> f = view(message);
                f.put("msgId", id == null ? message.getMsgId() : id);
                f.put("transactionId", message.getTransactionId());
                f.put("answer", answer.name());
                emit("checked", f);
                return answer;
            }
        });
        producer.start();
        int count = a.integer("count", 1);
        int sent = 0;
        int failed = 0;
        long started = System.nanoTime();
        for (int i = 0; i < count && !stopped(); i++) {
            Message m = message(a, topic, i, null);
            long t0 = System.nanoTime();
            try {
                SendResult r = producer.sendMessageInTransaction(m, null);
                emit("sent", receipt(i, m, r, System.nanoTime() - t0));
                sent++;
            } catch (Exception e) {
                Map<String, Object> f = fields("index", i);
                f.putAll(error(e));
                f.put("latencyMs", (System.nanoTime() - t0) / 1e6);
                emit("send_failed", f);
                failed++;
            }
        }
        // An unknown outcome is the broker's to check back: wait for every message's check (or the timeout).
        long deadline = System.nanoTime() + (long) (a.number("timeout-s", 60) * 1e9);
        if (local == LocalTransactionState.UNKNOW) {
            while (checked.size() < sent && System.nanoTime() < deadline && !pause(100)) {
                Thread.onSpinWait();
            }
        }
        pause((long) (a.number("linger-s", 0) * 1000));
        producer.shutdown();
        emit("summary", fields("command", "transaction", "sent", sent, "failed", failed, "checked", checked.size(),
            "elapsedMs", (System.nanoTime() - started) / 1e6));
    }

    // ---- consumers ----

    // What a consumer saw: deliveries per message id, and the ids consumed successfully.
    static final class Tally {
        final Map<String, AtomicInteger> deliveries = new ConcurrentHashMap<>();
        final Set<String> consumed = ConcurrentHashMap.newKeySet();
        final AtomicInteger received = new AtomicInteger();
        final AtomicInteger duplicates = new AtomicInteger();
        final int failFirst;
        final int expect;
        final CountDownLatch done = new CountDownLatch(1);

        Tally(Args a) {
            failFirst = a.integer("fail-first", 0);
            expect = a.integer("expect", -1);
        }

        // Prints the delivery; true if it is to be consumed, false if it is to be failed (--fail-first).
        boolean deliver(MessageExt m) {
            int delivery = deliveries.computeIfAbsent(m.getMsgId(), k -> new AtomicInteger()).incrementAndGet();
            boolean ok = delivery > failFirst;
            Map<String, Object> f = view(m);
            f.put("delivery", delivery);
            f.put("result", ok ? "consumed" : "failed");
            f.put("thread", Thread.currentThread().getName());
            received.incrementAndGet();
            emit("received", f);
            if (ok) {
                if (!consumed.add(m.getMsgId())) {
                    duplicates.incrementAndGet();
                }
                if (expect >= 0 && consumed.size() >= expect) {
                    done.countDown();
                }
            }
            return ok;
        }

        // Until --expect messages were consumed, --timeout-s passed or stdin was closed; then --linger-s more.
        void await(Args a) throws InterruptedException {
            long timeoutMs = a.has("timeout-s") ? (long) (a.number("timeout-s", 0) * 1000) : -1;
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (!stopped() && done.getCount() > 0 && (timeoutMs < 0 || System.currentTimeMillis() < deadline)) {
                done.await(100, TimeUnit.MILLISECONDS);
            }
            pause((long) (a.number("linger-s", 0) * 1000));
        }

        Map<String, Object> summary(String command) {
            return fields("command", command, "received", received.get(), "distinct", deliveries.size(),
                "consumed", consumed.size(), "duplicates", duplicates.get(),
                "complete", expect < 0 || consumed.size() >= expect);
        }
    }

    static void push(Args a) throws Exception {
        String topic = a.required("topic");
        DefaultMQPushConsumer consumer = configure(new DefaultMQPushConsumer(a.required("group"), hook(a),
            new AllocateMessageQueueAveragely()), a);
        consumer.setConsumeFromWhere(from(a));
        consumer.setConsumeThreadMax(4);
        consumer.setConsumeThreadMin(4);
        if (a.has("sql")) {
            consumer.subscribe(topic, MessageSelector.bySql(a.get("sql", null)));
        } else {
            consumer.subscribe(topic, a.get("tag-expr", "*"));
        }
        if (a.has("broadcast")) {
            consumer.setMessageModel(MessageModel.BROADCASTING);
        }
        if (a.has("max-reconsume-times")) {
            consumer.setMaxReconsumeTimes(a.integer("max-reconsume-times", 16));
        }
        int retryDelayLevel = a.integer("retry-delay-level", 0);
        Tally tally = new Tally(a);
        if (a.has("orderly")) {
            consumer.registerMessageListener((MessageListenerOrderly) (messages, context) -> {
                for (MessageExt m : messages) {
                    if (!tally.deliver(m)) {
                        context.setSuspendCurrentQueueTimeMillis(500);
                        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
                    }
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                for (MessageExt m : messages) {
                    if (!tally.deliver(m)) {
                        context.setDelayLevelWhenNextConsume(retryDelayLevel);
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        consumer.start();
        emit("started", fields("command", "push", "group", consumer.getConsumerGroup()));
        tally.await(a);
        consumer.shutdown();
        emit("summary", tally.summary("push"));
    }

    static void pull(Args a) throws Exception {
        String topic = a.required("topic");
        DefaultLitePullConsumer consumer = configure(new DefaultLitePullConsumer(a.required("group"), hook(a)), a);
        consumer.setConsumeFromWhere(from(a));
        consumer.setAutoCommit(false);
        if (a.has("sql")) {
            consumer.subscribe(topic, MessageSelector.bySql(a.get("sql", null)));
        } else {
            consumer.subscribe(topic, a.get("tag-expr", "*"));
        }
        consumer.start();
        emit("started", fields("command", "pull", "group", consumer.getConsumerGroup()));
        Tally tally = new Tally(a);
        long timeoutMs = a.has("timeout-s") ? (long) (a.number("timeout-s", 0) * 1000) : -1;
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (!stopped() && tally.done.getCount() > 0 && (timeoutMs < 0 || System.currentTimeMillis() < deadline)) {
            List<MessageExt> messages = consumer.poll(500);
            for (MessageExt m : messages) {
                tally.deliver(m);
            }
            if (!messages.isEmpty()) {
                consumer.commitSync();
            }
        }
        consumer.shutdown();
        emit("summary", tally.summary("pull"));
    }

    // ---- serve: one producer and one consumer driven by JSON requests on stdin ----

    static final String SHARDING_KEY = "__SHARDINGKEY";  // RocketMQ 5's message group property (unknown to 4.9.8)

    // The attempts of the send running on this thread: the hook runs on the caller's thread for a sync send, once
    // before and once after each attempt that gets as far as the wire (an attempt whose broker address is unknown
    // never reaches it and sends nothing). An attempt with no "after" (an unchecked exception) stays "pending".
    static final ThreadLocal<List<Map<String, Object>>> ATTEMPTS = ThreadLocal.withInitial(ArrayList::new);

    static final class AttemptHook implements SendMessageHook {
        @Override
        public String hookName() {
            return "rocketraft-driver-attempts";
        }

        @Override
        public void sendMessageBefore(SendMessageContext context) {
            Map<String, Object> attempt = fields("broker", context.getBrokerAddr(), "pending", true);
            if (context.getMq() != null) {
                attempt.put("brokerName", context.getMq().getBrokerName());
                attempt.put("queueId", context.getMq().getQueueId());
            }
            ATTEMPTS.get().add(attempt);
        }

        @Override
        public void sendMessageAfter(SendMessageContext context) {
            List<Map<String, Object>> attempts = ATTEMPTS.get();
            if (attempts.isEmpty()) {
                return;
            }
            Map<String, Object> attempt = attempts.get(attempts.size() - 1);
            attempt.remove("pending");
            Exception e = context.getException();
            attempt.put("ok", e == null);
            if (e != null) {
                attempt.putAll(error(e));
                attempt.remove("message");
                attempt.put("message", String.valueOf(e.getMessage()));
            }
        }
    }

    static Map<String, Object> serveSend(DefaultMQProducer producer, String topic, JsonObject request) {
        String id = request.get("id").getAsString();
        Message m = new Message(topic, id.getBytes(StandardCharsets.UTF_8));
        m.setKeys(id);
        if (request.has("group") && !request.get("group").isJsonNull()) {
            m.putUserProperty(SHARDING_KEY, request.get("group").getAsString());
        }
        List<Map<String, Object>> attempts = ATTEMPTS.get();
        attempts.clear();
        long t0 = System.nanoTime();
        Map<String, Object> f;
        try {
            SendResult r = producer.send(m);
            f = receipt(0, m, r, System.nanoTime() - t0);
            f.remove("index");
            f.put("ok", true);
        } catch (Exception e) {
            f = error(e);
            f.put("ok", false);
            f.put("latencyMs", (System.nanoTime() - t0) / 1e6);
        }
        f.put("attempts", new ArrayList<>(attempts));
        attempts.clear();
        return f;
    }

    static Map<String, Object> delivered(MessageExt m) {
        return fields("id", m.getBody() == null ? null : new String(m.getBody(), StandardCharsets.UTF_8),
            "group", m.getProperty(SHARDING_KEY), "msgId", m.getMsgId(), "brokerName", m.getBrokerName(),
            "queueId", m.getQueueId(), "queueOffset", m.getQueueOffset(), "reconsumeTimes", m.getReconsumeTimes());
    }

    static Map<String, Object> servePoll(DefaultLitePullConsumer consumer, JsonObject request) {
        long timeoutMs = request.has("timeoutMs") ? request.get("timeoutMs").getAsLong() : 1000;
        int max = request.has("max") ? request.get("max").getAsInt() : 64;
        List<Object> messages = new ArrayList<>();
        // poll() hands out one pulled batch (one queue) at a time: wait for the first, then take what is there
        List<MessageExt> batch = consumer.poll(timeoutMs);
        while (!batch.isEmpty()) {
            for (MessageExt m : batch) {
                messages.add(delivered(m));
            }
            if (messages.size() >= max) {
                break;
            }
            batch = consumer.poll(0);
        }
        return fields("ok", true, "messages", messages);
    }

    static Map<String, Object> serveOne(DefaultMQProducer producer, DefaultLitePullConsumer consumer, String topic,
                                        JsonObject request) {
        String op = request.has("op") ? request.get("op").getAsString() : "";
        try {
            switch (op) {
                case "send":
                    if (producer == null) {
                        throw new IllegalStateException("this driver has no producer (--role consumer)");
                    }
                    return serveSend(producer, topic, request);
                case "poll":
                    if (consumer == null) {
                        throw new IllegalStateException("this driver has no consumer (--role producer)");
                    }
                    return servePoll(consumer, request);
                case "commit":
                    if (consumer == null) {
                        throw new IllegalStateException("this driver has no consumer (--role producer)");
                    }
                    consumer.commitSync();
                    return fields("ok", true);
                default:
                    throw new IllegalArgumentException("unknown op '" + op + "': send, poll or commit");
            }
        } catch (Exception e) {
            Map<String, Object> f = error(e);
            f.put("ok", false);
            return f;
        }
    }

    static void serve(Args a) throws Exception {
        String topic = a.required("topic");
        String role = a.get("role", "both");
        if (!List.of("producer", "consumer", "both").contains(role)) {
            throw new IllegalArgumentException("--role producer|consumer|both");
        }
        DefaultMQProducer producer = null;
        DefaultLitePullConsumer consumer = null;
        if (!role.equals("consumer")) {
            producer = configure(new DefaultMQProducer(a.get("producer-group", "rocketraft-driver-serve"), hook(a)),
                a);
            producer.getDefaultMQProducerImpl().registerSendMessageHook(new AttemptHook());
            producer.start();
        }
        if (!role.equals("producer")) {
            // manual commit: the caller commits only after it recorded what poll handed it (at-least-once)
            consumer = configure(new DefaultLitePullConsumer(a.required("group"), hook(a)), a);
            consumer.setConsumeFromWhere(from(a));
            consumer.setAutoCommit(false);
            consumer.subscribe(topic, a.get("tag-expr", "*"));
            consumer.start();
        }
        emit("started", fields("command", "serve", "role", role, "topic", topic,
            "group", consumer == null ? null : consumer.getConsumerGroup()));
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, a.integer("threads", 8)));
        AtomicInteger answered = new AtomicInteger();
        DefaultMQProducer p = producer;
        DefaultLitePullConsumer c = consumer;
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonObject request;
                try {
                    request = JsonParser.parseString(line).getAsJsonObject();
                } catch (Exception e) {
                    Map<String, Object> f = fields("req", null, "ok", false);
                    f.putAll(error(e));
                    emit("answer", f);
                    continue;
                }
                JsonElement req = request.get("req");
                pool.execute(() -> {
                    Map<String, Object> f = fields("req", req);
                    f.putAll(serveOne(p, c, topic, request));
                    emit("answer", f);
                    answered.incrementAndGet();
                });
            }
        }
        STDIN_CLOSED.countDown();
        pool.shutdown();
        pool.awaitTermination(10, TimeUnit.SECONDS);
        if (consumer != null) {
            consumer.shutdown();
        }
        if (producer != null) {
            producer.shutdown();
        }
        emit("summary", fields("command", "serve", "answered", answered.get()));
    }

    // ---- admin and queries ----

    static DefaultMQAdminExt admin(Args a) throws Exception {
        DefaultMQAdminExt admin = configure(new DefaultMQAdminExt(hook(a), 5000), a);
        admin.start();
        return admin;
    }

    static Map<String, Object> brokerData(BrokerData b) {
        Map<String, Object> addrs = new TreeMap<>();
        b.getBrokerAddrs().forEach((id, addr) -> addrs.put(String.valueOf(id), addr));
        return fields("cluster", b.getCluster(), "brokerName", b.getBrokerName(), "brokerAddrs", addrs);
    }

    static void adminRoute(Args a) throws Exception {
        DefaultMQAdminExt admin = admin(a);
        int found = 0;
        try {
            TopicRouteData route = admin.examineTopicRouteInfo(a.required("topic"));
            List<Object> brokers = new ArrayList<>();
            for (BrokerData b : route.getBrokerDatas()) {
                brokers.add(brokerData(b));
            }
            List<Object> queues = new ArrayList<>();
            for (QueueData q : route.getQueueDatas()) {
                queues.add(fields("brokerName", q.getBrokerName(), "readQueueNums", q.getReadQueueNums(),
                    "writeQueueNums", q.getWriteQueueNums(), "perm", q.getPerm(), "topicSysFlag", q.getTopicSysFlag()));
            }
            emit("route", fields("topic", a.required("topic"), "brokerDatas", brokers, "queueDatas", queues,
                "orderTopicConf", route.getOrderTopicConf(), "filterServerTable", route.getFilterServerTable()));
            found = 1;
        } catch (Exception e) {
            emitError("route", e);
        }
        admin.shutdown();
        emit("summary", fields("command", "admin-route", "found", found));
    }

    static void adminCluster(Args a) throws Exception {
        DefaultMQAdminExt admin = admin(a);
        int found = 0;
        try {
            ClusterInfo info = admin.examineBrokerClusterInfo();
            Map<String, Object> brokers = new TreeMap<>();
            info.getBrokerAddrTable().forEach((name, b) -> brokers.put(name, brokerData(b)));
            emit("cluster", fields("brokerAddrTable", brokers, "clusterAddrTable", info.getClusterAddrTable()));
            found = 1;
        } catch (Exception e) {
            emitError("cluster", e);
        }
        admin.shutdown();
        emit("summary", fields("command", "admin-cluster", "found", found));
    }

    static void queryId(Args a) throws Exception {
        DefaultMQAdminExt admin = admin(a);
        int found = 0;
        try {
            emit("found", view(admin.viewMessage(a.required("topic"), a.required("msg-id"))));
            found = 1;
        } catch (Exception e) {
            emitError("query-id", e);
        }
        admin.shutdown();
        emit("summary", fields("command", "query-id", "found", found));
    }

    static void queryKey(Args a) throws Exception {
        DefaultMQAdminExt admin = admin(a);
        int found = 0;
        try {
            QueryResult result = admin.queryMessage(a.required("topic"), a.required("key"), a.integer("max", 64), 0,
                Long.MAX_VALUE);
            for (MessageExt m : result.getMessageList()) {
                emit("found", view(m));
                found++;
            }
        } catch (Exception e) {
            emitError("query-key", e);
        }
        admin.shutdown();
        emit("summary", fields("command", "query-key", "found", found));
    }

    static void emitError(String op, Exception e) {
        Map<String, Object> f = fields("op", op);
        f.putAll(error(e));
        emit("error", f);
    }

    static String offsetStoreDir(Args a) throws IOException {
        if (a.has("offset-store-dir")) {
            return a.get("offset-store-dir", null);
        }
        Path dir = Files.createTempDirectory("rocketraft-driver-offsets");
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try (Stream<Path> paths = Files.walk(dir)) {
                paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            } catch (IOException ignored) {
                // a leftover temporary directory is harmless
            }
        }));
        return dir.toString();
    }

    public static void main(String[] argv) {
        if (argv.length == 0) {
            System.err.println("usage: java -jar remoting-java-driver.jar <command> --namesrv host:port ... "
                + "(the header of Driver.java lists the commands)");
            System.exit(2);
        }
        boolean serving = argv[0].equals("serve");  // serve reads stdin itself, as its requests
        Thread stdin = new Thread(() -> {
            byte[] buffer = new byte[256];
            try (InputStream in = System.in) {
                while (in.read(buffer) >= 0) {
                    // only its end matters
                }
            } catch (Exception ignored) {
                // a closed stdin is the same as its end
            }
            STDIN_CLOSED.countDown();
        }, "stdin");
        stdin.setDaemon(true);
        if (!serving) {
            stdin.start();
        }
        int status = 0;
        try {
            Args a = Args.parse(argv);
            if (a.has("tls")) {
                System.setProperty("tls.enable", "true");
            }
            // a broadcasting consumer's offsets live in files (LocalFileOffsetStore, read once when the class loads):
            // in a directory of the run's own, never shared with another run through ~/.rocketmq_offsets
            System.setProperty("rocketmq.client.localOffsetStoreDir", offsetStoreDir(a));
            switch (argv[0]) {
                case "send": send(a); break;
                case "transaction": transaction(a); break;
                case "push": push(a); break;
                case "pull": pull(a); break;
                case "admin-route": adminRoute(a); break;
                case "admin-cluster": adminCluster(a); break;
                case "query-id": queryId(a); break;
                case "query-key": queryKey(a); break;
                case "serve": serve(a); break;
                default: throw new IllegalArgumentException("unknown command " + argv[0]);
            }
        } catch (Throwable t) {
            emit("fatal", error(t));
            status = 1;
        }
        System.exit(status);
    }
}
