// Drives the official Go SDK (github.com/apache/rocketmq-clients/golang/v5) for the tests in this folder and for
// `python -m bench sdk-failover --sdk go`: one JSON line per event on stdout ({"event": ..., ...}), the SDK's own log
// in the directory named by the environment variable rocketmq.client.logRoot; a consumer, and a producer that waits
// for check-backs, run until stdin is closed.
//
//	sdk-go-driver send <endpoints> <topic> '<JSON list of messages>'
//	sdk-go-driver send_loop <endpoints> <topic>
//	sdk-go-driver simple <endpoints> <group> <topic> <count> <ack|redeliver>
//
// A message of `send`: {body (text) or body_bytes (that many "x"), tag?, keys?, properties?, message_group?, delay_s?, transaction?}; transaction
// "commit" or "rollback" ends it at once, "check" leaves it to the checker, which answers with the message's property
// "answer" (COMMIT or ROLLBACK). `redeliver`: a message's first delivery is not acknowledged but made visible again
// after 1 s (ChangeInvisibleDuration); later deliveries are acknowledged. The SDK (v5.1.4) has a push consumer too,
// not driven here. Environment: SDK_ACCESS_KEY and SDK_SECRET_KEY (ACL 2.0), SDK_NAMESPACE. The SDK connects with TLS
// unless the environment variable rocketmq.client.enableSsl is "false".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

const invisible = 15 * time.Second

var (
	outMu       sync.Mutex
	stdinClosed = make(chan struct{})
)

type fields map[string]any

func emit(event string, f fields) {
	line := fields{"event": event}
	for k, v := range f {
		line[k] = v
	}
	data, _ := json.Marshal(line)
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(data, '\n'))
}

func errorText(err error) string {
	text := err.Error()
	if len(text) > 500 {
		text = text[:500]
	}
	return text
}

func config(endpoints, group string) *rmq.Config {
	return &rmq.Config{
		Endpoint:      endpoints,
		NameSpace:     os.Getenv("SDK_NAMESPACE"),
		ConsumerGroup: group,
		Credentials: &credentials.SessionCredentials{
			AccessKey: os.Getenv("SDK_ACCESS_KEY"), AccessSecret: os.Getenv("SDK_SECRET_KEY"),
		},
	}
}

func millis(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMilli()
}

func str(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// view is a received message as the tests compare it (every field the SDK's MessageView offers).
func view(m *rmq.MessageView) fields {
	return fields{
		"id": m.GetMessageId(), "topic": m.GetTopic(), "body": bodyText(m.GetBody()), "body_bytes": len(m.GetBody()),
		"tag": str(m.GetTag()), "keys": m.GetKeys(), "message_group": str(m.GetMessageGroup()),
		"properties": m.GetProperties(), "born_timestamp_ms": millis(m.GetBornTimestamp()),
		"born_host": str(m.GetBornHost()), "delivery_timestamp_ms": millis(m.GetDeliveryTimestamp()),
		"attempt": m.GetDeliveryAttempt(), "offset": m.GetOffset(),
	}
}

func bodyText(body []byte) any {
	if len(body) > 1000 {
		return nil
	}
	return string(body)
}

type spec struct {
	Body         string            `json:"body"`
	BodyBytes    int               `json:"body_bytes"`
	Tag          string            `json:"tag"`
	Keys         []string          `json:"keys"`
	Properties   map[string]string `json:"properties"`
	MessageGroup string            `json:"message_group"`
	DelayS       int64             `json:"delay_s"`
	Transaction  string            `json:"transaction"`
}

func build(topic string, s spec) *rmq.Message {
	body := []byte(s.Body)
	if s.BodyBytes > 0 {
		body = bytes.Repeat([]byte("x"), s.BodyBytes)
	}
	m := &rmq.Message{Topic: topic, Body: body}
	if s.Tag != "" {
		m.SetTag(s.Tag)
	}
	if len(s.Keys) > 0 {
		m.SetKeys(s.Keys...)
	}
	if s.MessageGroup != "" {
		m.SetMessageGroup(s.MessageGroup)
	}
	if s.DelayS > 0 {
		m.SetDelayTimestamp(time.Now().Add(time.Duration(s.DelayS) * time.Second))
	}
	for k, v := range s.Properties {
		m.AddProperty(k, v)
	}
	return m
}

func send(endpoints, topic, specText string) error {
	var specs []spec
	if err := json.Unmarshal([]byte(specText), &specs); err != nil {
		return err
	}
	checks := false
	for _, s := range specs {
		checks = checks || s.Transaction == "check"
	}
	checker := &rmq.TransactionChecker{Check: func(m *rmq.MessageView) rmq.TransactionResolution {
		answer := m.GetProperties()["answer"]
		emit("checked", fields{"id": m.GetMessageId(), "answer": answer, "properties": m.GetProperties()})
		if answer == "COMMIT" {
			return rmq.COMMIT
		}
		return rmq.ROLLBACK
	}}
	producer, err := rmq.NewProducer(config(endpoints, ""), rmq.WithTopics(topic), rmq.WithTransactionChecker(checker))
	if err != nil {
		return err
	}
	if err := producer.Start(); err != nil {
		return err
	}
	defer producer.GracefulStop()
	for index, s := range specs {
		start := time.Now()
		var receipts []*rmq.SendReceipt
		var err error
		if s.Transaction != "" {
			transaction := producer.BeginTransaction()
			receipts, err = producer.SendWithTransaction(context.Background(), build(topic, s), transaction)
			if err == nil && s.Transaction == "commit" {
				err = transaction.Commit()
			} else if err == nil && s.Transaction == "rollback" {
				err = transaction.RollBack()
			}
		} else {
			receipts, err = producer.Send(context.Background(), build(topic, s))
		}
		if err != nil {
			emit("send_failed", fields{"index": index, "error": errorText(err)})
			continue
		}
		emit("sent", fields{"index": index, "id": receipts[0].MessageID, "transaction_id": receipts[0].TransactionId,
			"offset": receipts[0].Offset, "receipts": len(receipts), "elapsed_ms": time.Since(start).Milliseconds()})
	}
	emit("done", fields{})
	if checks {
		<-stdinClosed
	}
	return nil
}

// sendLoop sends one 1 KiB message at a time until stdin closes; a "send" line for each ({ok}), as the bench reads it.
func sendLoop(endpoints, topic string) error {
	producer, err := rmq.NewProducer(config(endpoints, ""), rmq.WithTopics(topic))
	if err != nil {
		return err
	}
	if err := producer.Start(); err != nil {
		return err
	}
	defer producer.GracefulStop()
	body := make([]byte, 1024)
	for {
		select {
		case <-stdinClosed:
			return nil
		default:
		}
		if _, err := producer.Send(context.Background(), &rmq.Message{Topic: topic, Body: body}); err != nil {
			emit("send", fields{"ok": false, "error": errorText(err)})
		} else {
			emit("send", fields{"ok": true})
		}
	}
}

func simple(endpoints, group, topic string, count int, mode string) error {
	consumer, err := rmq.NewSimpleConsumer(config(endpoints, group), rmq.WithSimpleAwaitDuration(2*time.Second),
		rmq.WithSimpleSubscriptionExpressions(map[string]*rmq.FilterExpression{topic: rmq.SUB_ALL}))
	if err != nil {
		return err
	}
	if err := consumer.Start(); err != nil {
		return err
	}
	defer consumer.GracefulStop()
	acked := map[string]bool{}
	for len(acked) < count {
		select {
		case <-stdinClosed:
			emit("done", fields{})
			return nil
		default:
		}
		messages, err := consumer.Receive(context.Background(), 16, invisible)
		var status *rmq.ErrRpcStatus
		if errors.As(err, &status) && status.Code == 40401 { // MESSAGE_NOT_FOUND: nothing to receive
			continue
		}
		if err != nil {
			emit("receive_failed", fields{"error": errorText(err)})
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for _, m := range messages {
			emit("received", view(m))
			if mode == "redeliver" && m.GetDeliveryAttempt() == 1 {
				if err := consumer.ChangeInvisibleDuration(m, time.Second); err != nil {
					emit("ack_failed", fields{"id": m.GetMessageId(), "error": errorText(err)})
				} else {
					emit("changed", fields{"id": m.GetMessageId()})
				}
				continue
			}
			if err := consumer.Ack(context.Background(), m); err != nil {
				emit("ack_failed", fields{"id": m.GetMessageId(), "error": errorText(err)})
			} else {
				acked[m.GetMessageId()] = true
				emit("acked", fields{"id": m.GetMessageId()})
			}
		}
	}
	emit("done", fields{})
	return nil
}

func main() {
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	args := os.Args[1:]
	var err error
	switch {
	case len(args) == 4 && args[0] == "send":
		err = send(args[1], args[2], args[3])
	case len(args) == 3 && args[0] == "send_loop":
		err = sendLoop(args[1], args[2])
	case len(args) == 6 && args[0] == "simple":
		count, _ := strconv.Atoi(args[4])
		err = simple(args[1], args[2], args[3], count, args[5])
	default:
		err = fmt.Errorf("usage: see the top of main.go; got %q", args)
	}
	if err != nil {
		emit("fatal", fields{"error": errorText(err)})
		os.Exit(2)
	}
}
