// Drives the official Java SDK (rocketmq-client-java) for the tests in this folder and for
// `python -m bench sdk-failover --sdk java`: one JSON line per event on stdout ({"event": ..., ...}), the SDK's own
// log under -Drocketmq.log.root; a consumer, and a producer that waits for check-backs, run until stdin is closed.
//
//   java -jar target/sdk-java-driver.jar send <endpoints> <topic> '<JSON list of messages>'
//   java -jar target/sdk-java-driver.jar send_loop <endpoints> <topic>
//   java -jar target/sdk-java-driver.jar simple <endpoints> <group> <topic> <count> <ack|redeliver>
//   java -jar target/sdk-java-driver.jar push <endpoints> <group> <topic>
//
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
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
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

    public static void main(String[] args) {
        watchStdin();
        int status = 0;
        try {
            switch (args[0]) {
                case "send" -> send(args[1], args[2], args[3]);
                case "send_loop" -> sendLoop(args[1], args[2]);
                case "simple" -> simple(args[1], args[2], args[3], Integer.parseInt(args[4]), args[5]);
                case "push" -> push(args[1], args[2], args[3]);
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
