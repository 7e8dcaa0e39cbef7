// Drives the official Java SDK (rocketmq-client-java) for the tests in this folder and for
// `python -m bench sdk-failover --sdk java`: one JSON line per event on stdout ({"event": ..., ...}), the SDK's own
// log under -Drocketmq.log.root; a consumer, and a producer that waits for check-backs, run until stdin is closed.
//
//   java -jar target/sdk-java-driver.jar send <endpoints> <topic> '<JSON list of messages>'
//   java -jar target/sdk-java-driver.jar send_loop <endpoints> <topic>
//   java -jar target/sdk-java-driver.jar simple <endpoints> <group> <topic> <count> <ack|redeliver>
//   java -jar target/sdk-java-driver.jar push <endpoints> <group> <topic>
//   java -jar target/sdk-java-driver.jar bench_publish <endpoints> <topic> <in_flight> <body_bytes> <warmup_s> <s>
//   java -jar target/sdk-java-driver.jar bench_send_loop <endpoints> <topic> <body_bytes>
//   java -jar target/sdk-java-driver.jar bench_latency <endpoints> <topic> <body_bytes> <warmup> <count>
//   java -jar target/sdk-java-driver.jar bench_drain <endpoints> <group> <topic> <body_bytes> <count> <limit_s>
//                                        [push,simple]
//
// The bench_ modes (`python -m bench compare --peers rocketmq`) print one line, their figure: bench_publish the acks
// counted in [warmup_s, warmup_s + seconds) with sendAsync and in_flight sends outstanding; bench_latency p50/p99 of
// one producer.send at a time; bench_drain stores count messages (sendAsync, 256 outstanding), then each consumer
// named, in turn and in a group of its own, receives them all: a PushConsumer (the SDK's defaults) or a
// SimpleConsumer on 4 threads (receive(32), ackAsync each); msgs/s from its build to the count-th distinct message;
// bench_send_loop is send_loop with each send's start and end times.
// A message of `send`: {body (text) or body_bytes (that many "x"), tag?, keys?, properties?, message_group?, delay_s?, transaction?}; transaction
// "commit" or "rollback" ends it at once, "check" leaves it to the checker, which answers with the message's
// property "answer" (COMMIT or ROLLBACK). `redeliver`: a message's first delivery is not acknowledged but made
// visible again after 1 s (ChangeInvisibleDuration); later deliveries are acknowledged. `push`: the listener fails a
// message whose property "fail" is "once" on its first delivery (the SDK then retries it), and succeeds otherwise.
// Environment: SDK_TLS (1, the SDK's default, or 0), SDK_ACCESS_KEY and SDK_SECRET_KEY (ACL 2.0), SDK_NAMESPACE.
package rocketraft.sdkjava;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.ProducerBuilder;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

public final class Driver {
    private static final Gson GSON = new Gson();
    private static final CountDownLatch STDIN_CLOSED = new CountDownLatch(1);
    private static final int INVISIBLE_S = 15;
    private static final int DRAIN_RECEIVERS = 4;

    private Driver() {
    }

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

    // The exception and its causes (the SDK wraps a server's refusal), at most 1,000 characters.
    static String errorText(Throwable t) {
        StringBuilder text = new StringBuilder();
        for (Throwable c = t; c != null && text.length() < 1000; c = c.getCause() == c ? null : c.getCause()) {
            text.append(text.length() == 0 ? "" : " <- ").append(c.getClass().getSimpleName()).append(": ")
                .append(c.getMessage());
        }
        return text.length() > 1000 ? text.substring(0, 1000) : text.toString();
    }

    // Closes a client, waiting at most 5 s: a push consumer's close waits for its long polls to end.
    static void closeWithin(AutoCloseable client) throws InterruptedException {
        Thread thread = new Thread(() -> {
            try {
                client.close();
            } catch (Exception ignored) {
                // the process ends anyway
            }
        }, "close");
        thread.setDaemon(true);
        thread.start();
        thread.join(5000);
    }

    static ClientConfiguration configuration(String endpoints) {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder().setEndpoints(endpoints)
            .setRequestTimeout(Duration.ofSeconds(3));
        String tls = System.getenv("SDK_TLS");
        if (tls != null) {
            builder.enableSsl(!tls.equals("0"));
        }
        String accessKey = System.getenv("SDK_ACCESS_KEY");
        if (accessKey != null && !accessKey.isEmpty()) {
            builder.setCredentialProvider(new StaticSessionCredentialsProvider(accessKey,
                System.getenv().getOrDefault("SDK_SECRET_KEY", "")));
        }
        String namespace = System.getenv("SDK_NAMESPACE");
        if (namespace != null) {
            builder.setNamespace(namespace);
        }
        return builder.build();
    }

    // A received message as the tests compare it (every field the SDK's MessageView offers).
    static Map<String, Object> view(MessageView m) {
        ByteBuffer buffer = m.getBody().duplicate();
        byte[] body = new byte[buffer.remaining()];
        buffer.get(body);
        return fields("id", m.getMessageId().toString(), "topic", m.getTopic(),
            "body", body.length > 1000 ? null : new String(body, StandardCharsets.UTF_8), "body_bytes", body.length,
            "tag", m.getTag().orElse(null), "keys", new ArrayList<>(m.getKeys()),
            "message_group", m.getMessageGroup().orElse(null), "properties", m.getProperties(),
            "born_timestamp_ms", m.getBornTimestamp(), "born_host", m.getBornHost(),
            "delivery_timestamp_ms", m.getDeliveryTimestamp().orElse(null), "attempt", m.getDeliveryAttempt());
    }

    // The receipt's transaction id: the SDK keeps it (SendReceiptImpl.getTransactionId) but its interface does not
    // declare it, so it is read by reflection; null where the SDK has no such method.
    static Object transactionIdOf(SendReceipt receipt) {
        try {
            Method method = receipt.getClass().getMethod("getTransactionId");
            return method.invoke(receipt);
        } catch (ReflectiveOperationException e) {
            return null;
        }
    }

    static String recallHandleOf(SendReceipt receipt) {
        try {
            return receipt.getRecallHandle();
        } catch (Throwable t) {  // an SDK older than recall
            return null;
        }
    }

    static void watchStdin() {
        Thread thread = new Thread(() -> {
            try {
                while (System.in.read() != -1) {
                    // nothing: the test closes stdin to stop us
                }
            } catch (Exception ignored) {
                // closed
            }
            STDIN_CLOSED.countDown();
        }, "stdin");
        thread.setDaemon(true);
        thread.start();
    }

    static Message build(ClientServiceProvider provider, String topic, JsonObject spec) {
        byte[] body = spec.has("body_bytes") ? "x".repeat(spec.get("body_bytes").getAsInt()).getBytes(StandardCharsets.UTF_8)
            : spec.get("body").getAsString().getBytes(StandardCharsets.UTF_8);
        MessageBuilder builder = provider.newMessageBuilder().setTopic(topic).setBody(body);
        if (spec.has("tag")) {
            builder.setTag(spec.get("tag").getAsString());
        }
        if (spec.has("keys")) {
            List<String> keys = new ArrayList<>();
            for (JsonElement key : spec.getAsJsonArray("keys")) {
                keys.add(key.getAsString());
            }
            builder.setKeys(keys.toArray(new String[0]));
        }
        if (spec.has("message_group")) {
            builder.setMessageGroup(spec.get("message_group").getAsString());
        }
        if (spec.has("delay_s")) {
            builder.setDeliveryTimestamp(System.currentTimeMillis() + spec.get("delay_s").getAsLong() * 1000);
        }
        if (spec.has("properties")) {
            for (Map.Entry<String, JsonElement> e : spec.getAsJsonObject("properties").entrySet()) {
                builder.addProperty(e.getKey(), e.getValue().getAsString());
            }
        }
        return builder.build();
    }

    static void send(String endpoints, String topic, String specText) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        JsonArray specs = GSON.fromJson(specText, JsonArray.class);
        boolean checks = false;
        boolean transactions = false;
        for (JsonElement e : specs) {
            JsonObject spec = e.getAsJsonObject();
            transactions |= spec.has("transaction");
            checks |= spec.has("transaction") && spec.get("transaction").getAsString().equals("check");
        }
        ProducerBuilder builder = provider.newProducerBuilder().setClientConfiguration(configuration(endpoints))
            .setTopics(topic);
        if (transactions) {
            builder.setTransactionChecker(view -> {
                String answer = view.getProperties().getOrDefault("answer", "ROLLBACK");
                emit("checked", fields("id", view.getMessageId().toString(), "answer", answer,
                    "properties", view.getProperties()));
                return TransactionResolution.valueOf(answer);
            });
        }
        Producer producer = builder.build();
        int index = 0;
        for (JsonElement e : specs) {
            JsonObject spec = e.getAsJsonObject();
            Message message = build(provider, topic, spec);
            long start = System.nanoTime();
            try {
                SendReceipt receipt;
                if (spec.has("transaction")) {
                    Transaction transaction = producer.beginTransaction();
                    receipt = producer.send(message, transaction);
                    String end = spec.get("transaction").getAsString();
                    if (end.equals("commit")) {
                        transaction.commit();
                    } else if (end.equals("rollback")) {
                        transaction.rollback();
                    }
                } else {
                    receipt = producer.send(message);
                }
                emit("sent", fields("index", index, "id", receipt.getMessageId().toString(),
                    "transaction_id", transactionIdOf(receipt), "recall_handle", recallHandleOf(receipt),
                    "elapsed_ms", (System.nanoTime() - start) / 1_000_000));
            } catch (Exception ex) {
                emit("send_failed", fields("index", index, "error", errorText(ex)));
            }
            index++;
        }
        emit("done", fields());
        if (checks) {
            STDIN_CLOSED.await();
        }
        closeWithin(producer);
    }

    // One 1 KiB message at a time until stdin closes; a "send" line for each ({ok}), as the bench reads it.
    static void sendLoop(String endpoints, String topic) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = provider.newProducerBuilder().setClientConfiguration(configuration(endpoints))
            .setTopics(topic).build();
        byte[] body = new byte[1024];
        while (STDIN_CLOSED.getCount() > 0) {
            Message message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            try {
                producer.send(message);
                emit("send", fields("ok", true));
            } catch (Exception ex) {
                emit("send", fields("ok", false, "error", errorText(ex)));
            }
        }
        closeWithin(producer);
    }

    // send_loop with each send's own times (microseconds since the epoch, this machine's clock): the bench's failover
    // compares them with the moment it killed the master, free of the delay of reading this process's output.
    static void benchSendLoop(String endpoints, String topic, int bodyBytes) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = benchProducer(provider, endpoints, topic);
        byte[] body = new byte[bodyBytes];
        while (STDIN_CLOSED.getCount() > 0) {
            Message message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            long startUs = epochMicros();
            try {
                producer.send(message);
                emit("send", fields("ok", true, "start_us", startUs, "end_us", epochMicros()));
            } catch (Exception ex) {
                emit("send", fields("ok", false, "start_us", startUs, "end_us", epochMicros(), "error", errorText(ex)));
            }
        }
        closeWithin(producer);
    }

    static long epochMicros() {
        java.time.Instant now = java.time.Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1000;
    }

    static void simple(String endpoints, String group, String topic, int count, String mode) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(configuration(endpoints))
            .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(2))
            .setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL)).build();
        Set<String> acked = new HashSet<>();
        while (STDIN_CLOSED.getCount() > 0 && acked.size() < count) {
            List<MessageView> messages;
            try {
                messages = consumer.receive(16, Duration.ofSeconds(INVISIBLE_S));
            } catch (Exception ex) {
                emit("receive_failed", fields("error", errorText(ex)));
                Thread.sleep(200);
                continue;
            }
            for (MessageView m : messages) {
                emit("received", view(m));
                try {
                    if (mode.equals("redeliver") && m.getDeliveryAttempt() == 1) {
                        consumer.changeInvisibleDuration(m, Duration.ofSeconds(1));
                        emit("changed", fields("id", m.getMessageId().toString()));
                    } else {
                        consumer.ack(m);
                        acked.add(m.getMessageId().toString());
                        emit("acked", fields("id", m.getMessageId().toString()));
                    }
                } catch (Exception ex) {
                    emit("ack_failed", fields("id", m.getMessageId().toString(), "error", errorText(ex)));
                }
            }
        }
        emit("done", fields());
        closeWithin(consumer);
    }

    static void push(String endpoints, String group, String topic) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(configuration(endpoints))
            .setConsumerGroup(group).setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL))
            .setMessageListener(m -> {
                Map<String, Object> view = view(m);
                boolean fail = "once".equals(m.getProperties().get("fail")) && m.getDeliveryAttempt() == 1;
                view.put("result", fail ? "FAILURE" : "SUCCESS");
                emit("received", view);
                return fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
            }).build();
        emit("started", fields());
        STDIN_CLOSED.await();
        closeWithin(consumer);
    }

    // sendAsync with at most inFlight outstanding until `until` (System.nanoTime); acks that complete inside
    // [from, to) counted in counts[2], all acks in counts[0], failures in counts[1]. Returns once every send ended.
    static void sendWindow(Producer producer, ClientServiceProvider provider, String topic, byte[] body, int inFlight,
                           long until, long from, long to, AtomicLong[] counts, AtomicReference<String> firstError)
        throws InterruptedException {
        Semaphore slots = new Semaphore(inFlight);
        long sent = 0;
        while (System.nanoTime() < until) {
            slots.acquire();
            Message message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            producer.sendAsync(message).whenComplete((receipt, error) -> {
                if (error != null) {
                    counts[1].incrementAndGet();
                    firstError.compareAndSet(null, errorText(error));
                } else {
                    counts[0].incrementAndGet();
                    long now = System.nanoTime();
                    if (now >= from && now < to) {
                        counts[2].incrementAndGet();
                    }
                }
                slots.release();
            });
            sent++;
            if (counts.length > 3 && sent >= counts[3].get()) {
                break;  // a count to send rather than a time
            }
        }
        if (!slots.tryAcquire(inFlight, 60, TimeUnit.SECONDS)) {
            firstError.compareAndSet(null, "sends still outstanding 60 s after the window");
        }
    }

    static AtomicLong[] counters(int n) {
        AtomicLong[] counts = new AtomicLong[n];
        for (int i = 0; i < n; i++) {
            counts[i] = new AtomicLong();
        }
        return counts;
    }

    static Producer benchProducer(ClientServiceProvider provider, String endpoints, String topic) throws Exception {
        return provider.newProducerBuilder().setClientConfiguration(configuration(endpoints)).setTopics(topic).build();
    }

    static void benchPublish(String endpoints, String topic, int inFlight, int bodyBytes, double warmupS,
                             double seconds) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = benchProducer(provider, endpoints, topic);
        AtomicLong[] counts = counters(3);
        AtomicReference<String> firstError = new AtomicReference<>();
        long began = System.nanoTime();
        long from = began + (long) (warmupS * 1e9);
        long to = from + (long) (seconds * 1e9);
        sendWindow(producer, provider, topic, new byte[bodyBytes], inFlight, to, from, to, counts, firstError);
        emit("bench_publish", fields("msgs_per_s", counts[2].get() / seconds, "in_window", counts[2].get(),
            "acked", counts[0].get(), "failed", counts[1].get(), "first_error", firstError.get()));
        closeWithin(producer);
    }

    static void benchLatency(String endpoints, String topic, int bodyBytes, int warmup, int count) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = benchProducer(provider, endpoints, topic);
        byte[] body = new byte[bodyBytes];
        double[] samples = new double[count];
        int taken = 0;
        long failed = 0;
        String firstError = null;
        for (int i = 0; i < warmup + count; i++) {
            Message message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            long start = System.nanoTime();
            try {
                producer.send(message);
            } catch (Exception ex) {
                failed++;
                firstError = firstError == null ? errorText(ex) : firstError;
                continue;
            }
            if (i >= warmup) {
                samples[taken++] = (System.nanoTime() - start) / 1e6;
            }
        }
        double[] sorted = Arrays.copyOf(samples, taken);
        Arrays.sort(sorted);
        // bench.client's percentile: the value at int(n * fraction)
        emit("bench_latency", fields("count", taken, "failed", failed, "first_error", firstError,
            "p50_ms", taken == 0 ? null : sorted[Math.min(taken - 1, (int) (taken * 0.5))],
            "p99_ms", taken == 0 ? null : sorted[Math.min(taken - 1, (int) (taken * 0.99))],
            "max_ms", taken == 0 ? null : sorted[taken - 1]));
        closeWithin(producer);
    }

    static void arrived(Set<String> seen, MessageView m, long stored, AtomicLong lastNs, CountDownLatch all) {
        if (seen.add(m.getMessageId().toString()) && seen.size() >= stored) {
            lastNs.compareAndSet(0, System.nanoTime());
            all.countDown();
        }
    }

    // DRAIN_RECEIVERS threads, each receive(32) then an ackAsync per message, until every stored message came.
    static AutoCloseable simpleDrain(ClientServiceProvider provider, String endpoints, String group, String topic,
                                     Set<String> seen, long stored, AtomicLong lastNs, CountDownLatch all)
        throws Exception {
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(configuration(endpoints))
            .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(5))
            .setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL)).build();
        for (int i = 0; i < DRAIN_RECEIVERS; i++) {
            Thread thread = new Thread(() -> {
                while (all.getCount() > 0) {
                    try {
                        for (MessageView m : consumer.receive(32, Duration.ofSeconds(INVISIBLE_S))) {
                            arrived(seen, m, stored, lastNs, all);
                            consumer.ackAsync(m);
                        }
                    } catch (Exception ex) {
                        emit("receive_failed", fields("error", errorText(ex)));
                    }
                }
            }, "drain-" + i);
            thread.setDaemon(true);
            thread.start();
        }
        return consumer;
    }

    static void benchDrain(String endpoints, String group, String topic, int bodyBytes, long count, double limitS,
                           String consumerKinds) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        Producer producer = benchProducer(provider, endpoints, topic);
        AtomicLong[] counts = counters(4);
        counts[3].set(count);
        AtomicReference<String> firstError = new AtomicReference<>();
        long fillBegan = System.nanoTime();
        sendWindow(producer, provider, topic, new byte[bodyBytes], 256, Long.MAX_VALUE, 0, 0, counts, firstError);
        double fillS = (System.nanoTime() - fillBegan) / 1e9;
        closeWithin(producer);
        long stored = counts[0].get();
        Map<String, Object> drains = new LinkedHashMap<>();
        for (String kind : consumerKinds.split(",")) {  // each its own group: each reads every stored message
            drains.put(kind, drainOnce(provider, endpoints, group + "-" + kind, topic, stored, limitS, kind));
        }
        emit("bench_drain", fields("stored", stored, "fill_failed", counts[1].get(), "fill_error", firstError.get(),
            "fill_msgs_per_s", stored / fillS, "consumers", drains));
    }

    static Map<String, Object> drainOnce(ClientServiceProvider provider, String endpoints, String group, String topic,
                                         long stored, double limitS, String kind) throws Exception {
        Set<String> seen = ConcurrentHashMap.newKeySet();
        CountDownLatch all = new CountDownLatch(1);
        AtomicLong lastNs = new AtomicLong();
        long began = System.nanoTime();
        AutoCloseable consumer = kind.equals("simple")
            ? simpleDrain(provider, endpoints, group, topic, seen, stored, lastNs, all)
            : provider.newPushConsumerBuilder().setClientConfiguration(configuration(endpoints))
                .setConsumerGroup(group).setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL))
                .setMessageListener(m -> {
                    arrived(seen, m, stored, lastNs, all);
                    return ConsumeResult.SUCCESS;
                }).build();
        boolean complete = all.await((long) (limitS * 1000), TimeUnit.MILLISECONDS);
        double elapsedS = ((complete ? lastNs.get() : System.nanoTime()) - began) / 1e9;
        int received = Math.min(seen.size(), (int) stored);
        all.countDown();  // a simple drain's receivers stop
        closeWithin(consumer);
        return fields("received", received, "elapsed_s", elapsedS, "msgs_per_s", received / elapsedS);
    }

    public static void main(String[] args) {
        watchStdin();
        int status = 0;
        try {
            switch (args[0]) {
                case "send" -> send(args[1], args[2], args[3]);
                case "send_loop" -> sendLoop(args[1], args[2]);
                case "simple" -> simple(args[1], args[2], args[3], Integer.parseInt(args[4]), args[5]);
                case "push" -> push(args[1], args[2], args[3]);
                case "bench_publish" -> benchPublish(args[1], args[2], Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]), Double.parseDouble(args[5]), Double.parseDouble(args[6]));
                case "bench_send_loop" -> benchSendLoop(args[1], args[2], Integer.parseInt(args[3]));
                case "bench_latency" -> benchLatency(args[1], args[2], Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]), Integer.parseInt(args[5]));
                case "bench_drain" -> benchDrain(args[1], args[2], args[3], Integer.parseInt(args[4]),
                    Long.parseLong(args[5]), Double.parseDouble(args[6]), args.length > 7 ? args[7] : "push");
                default -> throw new IllegalArgumentException("unknown command " + args[0]);
            }
        } catch (Throwable t) {
            emit("fatal", fields("error", errorText(t)));
            status = 2;
        }
        System.out.flush();
        // The SDK leaves non-daemon threads behind after close(): end the JVM here.
        Runtime.getRuntime().halt(status);
    }
}
