// Drives the RocketMQ 4.x Go client (github.com/apache/rocketmq-client-go/v2, the Remoting protocol) for the tests
// that point real 4.x applications at a NameServer (devkit/remotingdrivers.py runs it). Its commands, options and
// JSON lines are those of the Java 4.x driver (tests/remoting_java/.../Driver.java), where the Go client has them:
// one JSON line per event on stdout ({"event": ..., ...}), a final "summary" line, an early stop when stdin is
// closed, {"event": "fatal", ...} (exit 1) when the client cannot start. The client's own log goes to stderr, or to
// the file named by REMOTING_DRIVER_LOG, at the level ROCKETMQ_GO_LOG_LEVEL (default warn).
//
//	remoting-go-driver send --namesrv host:port --topic T [--count N] [--tag X] [--keys K] [--property k=v]...
//	    [--delay-level L] [--body B] [--body-size B] [--batch K] [--orderly-key-count K] [--interval-ms M]
//	    [--duration-s S] [--group G] [--retries R] [--send-timeout-ms M]
//	remoting-go-driver transaction --namesrv host:port --topic T [--count N] --resolve commit|rollback|unknown-then-commit
//	    [--check-answer commit|rollback] [--timeout-s S] [--linger-s S] [--group G]
//	remoting-go-driver push --namesrv host:port --topic T --group G [--tag-expr 'a||b' | --sql 'a > 1'] [--orderly]
//	    [--broadcast] [--expect N] [--timeout-s S] [--linger-s S] [--fail-first K] [--retry-delay-level L]
//	    [--max-reconsume-times M] [--from first|last]
//	remoting-go-driver pull --namesrv host:port --topic T --group G [--tag-expr E | --sql S] [--expect N] [--timeout-s S]
//
// Every command: --access-key/--secret-key (the client's ACL 1.0 signature), --tls (the client's TLS mode),
// --instance NAME. Messages as the Java driver makes them: body "message-{i}", {i} replaced by the index in --body,
// --tag, --keys and property values, the property seq=<index>, and with --orderly-key-count K the property
// orderKey=key-<index % K> choosing the queue by the key's Java String.hashCode modulo the queue count.
// Unlike the Java client, the Go client gives the messages of a batch (--batch K) no UNIQ_KEY: their "sent" events
// have msgId null, and consumers see their offsetMsgId as msgId.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

type fields map[string]any

var (
	outMu       sync.Mutex
	stdinClosed = make(chan struct{})
)

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

// class (the error's Go type) and message, at most 1,000 characters.
func errorFields(err error) fields {
	text := err.Error()
	if len(text) > 1000 {
		text = text[:1000]
	}
	cause := err
	for errors.Unwrap(cause) != nil {
		cause = errors.Unwrap(cause)
	}
	return fields{"class": reflect.TypeOf(cause).String(), "message": text}
}

func stopped() bool {
	select {
	case <-stdinClosed:
		return true
	default:
		return false
	}
}

// pause waits d (forever when negative), returning early, with true, when stdin is closed.
func pause(d time.Duration) bool {
	if d < 0 {
		<-stdinClosed
		return true
	}
	select {
	case <-stdinClosed:
		return true
	case <-time.After(d):
		return false
	}
}

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

type options struct {
	namesrv, topic, group, tag, keys, body, tagExpr, sql, resolve, checkAnswer, from string
	accessKey, secretKey, instance                                                   string
	count, bodySize, batch, orderlyKeyCount, delayLevel, retries, sendTimeoutMs      int
	intervalMs, expect, failFirst, retryDelayLevel, maxReconsumeTimes                int
	durationS, timeoutS, lingerS                                                     float64
	properties                                                                       repeated
	tls, orderly, broadcast                                                          bool
	set                                                                              map[string]bool
}

func parse(args []string) (*options, error) {
	o := &options{set: map[string]bool{}}
	fs := flag.NewFlagSet("remoting-go-driver", flag.ContinueOnError)
	fs.StringVar(&o.namesrv, "namesrv", "", "")
	fs.StringVar(&o.topic, "topic", "", "")
	fs.StringVar(&o.group, "group", "", "")
	fs.StringVar(&o.tag, "tag", "", "")
	fs.StringVar(&o.keys, "keys", "", "")
	fs.StringVar(&o.body, "body", "message-{i}", "")
	fs.StringVar(&o.tagExpr, "tag-expr", "*", "")
	fs.StringVar(&o.sql, "sql", "", "")
	fs.StringVar(&o.resolve, "resolve", "", "")
	fs.StringVar(&o.checkAnswer, "check-answer", "commit", "")
	fs.StringVar(&o.from, "from", "first", "")
	fs.StringVar(&o.accessKey, "access-key", "", "")
	fs.StringVar(&o.secretKey, "secret-key", "", "")
	fs.StringVar(&o.instance, "instance", fmt.Sprintf("go-driver-%d", os.Getpid()), "")
	fs.IntVar(&o.count, "count", 1, "")
	fs.IntVar(&o.bodySize, "body-size", -1, "")
	fs.IntVar(&o.batch, "batch", 1, "")
	fs.IntVar(&o.orderlyKeyCount, "orderly-key-count", 0, "")
	fs.IntVar(&o.delayLevel, "delay-level", 0, "")
	fs.IntVar(&o.retries, "retries", 2, "")
	fs.IntVar(&o.sendTimeoutMs, "send-timeout-ms", 3000, "")
	fs.IntVar(&o.intervalMs, "interval-ms", 0, "")
	fs.IntVar(&o.expect, "expect", -1, "")
	fs.IntVar(&o.failFirst, "fail-first", 0, "")
	fs.IntVar(&o.retryDelayLevel, "retry-delay-level", 0, "")
	fs.IntVar(&o.maxReconsumeTimes, "max-reconsume-times", -1, "")
	fs.Float64Var(&o.durationS, "duration-s", 0, "")
	fs.Float64Var(&o.timeoutS, "timeout-s", -1, "")
	fs.Float64Var(&o.lingerS, "linger-s", 0, "")
	fs.Var(&o.properties, "property", "")
	fs.BoolVar(&o.tls, "tls", false, "")
	fs.BoolVar(&o.orderly, "orderly", false, "")
	fs.BoolVar(&o.broadcast, "broadcast", false, "")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.namesrv == "" {
		return nil, errors.New("--namesrv is required")
	}
	return o, nil
}

func (o *options) credentials() primitive.Credentials {
	return primitive.Credentials{AccessKey: o.accessKey, SecretKey: o.secretKey}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ---- messages ----

func indexed(template string, index int) string {
	return strings.ReplaceAll(template, "{i}", strconv.Itoa(index))
}

func (o *options) message(index int) (*primitive.Message, error) {
	body := indexed(o.body, index)
	if o.bodySize >= 0 {
		if len(body) > o.bodySize {
			body = body[:o.bodySize]
		}
		body += strings.Repeat("x", o.bodySize-len(body))
	}
	m := primitive.NewMessage(o.topic, []byte(body))
	if o.tag != "" {
		m.WithTag(indexed(o.tag, index))
	}
	if o.keys != "" {
		m.WithKeys(strings.Fields(indexed(o.keys, index)))
	}
	for _, p := range o.properties {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--property wants k=v, not %q", p)
		}
		m.WithProperty(k, indexed(v, index))
	}
	m.WithProperty("seq", strconv.Itoa(index))
	if o.orderlyKeyCount > 0 {
		m.WithProperty("orderKey", fmt.Sprintf("key-%d", index%o.orderlyKeyCount))
	}
	if o.delayLevel > 0 {
		m.WithDelayTimeLevel(o.delayLevel)
	}
	return m, nil
}

// javaHash is Java's String.hashCode, so both drivers put an order key on the same queue.
func javaHash(s string) int32 {
	var h int32
	for _, c := range s {
		h = 31*h + int32(c)
	}
	return h
}

type byOrderKey struct{}

func (byOrderKey) Select(m *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	n := int32(len(mqs))
	return mqs[((javaHash(m.GetProperty("orderKey"))%n)+n)%n]
}

func receipt(index int, m *primitive.Message, r *primitive.SendResult, latency time.Duration) fields {
	f := fields{"index": index, "msgId": r.MsgID, "offsetMsgId": r.OffsetMsgID, "status": sendStatus(r.Status),
		"queueOffset": r.QueueOffset, "latencyMs": float64(latency.Microseconds()) / 1000,
		"at": time.Now().UnixMilli(), "tags": m.GetTags(), "keys": m.GetKeys()}
	if r.MessageQueue != nil {
		f["brokerName"], f["queueId"] = r.MessageQueue.BrokerName, r.MessageQueue.QueueId
	}
	if k := m.GetProperty("orderKey"); k != "" {
		f["orderKey"] = k
	}
	if r.TransactionID != "" {
		f["transactionId"] = r.TransactionID
	}
	return f
}

func sendStatus(s primitive.SendStatus) string {
	switch s {
	case primitive.SendOK:
		return "SEND_OK"
	case primitive.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case primitive.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case primitive.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	default:
		return fmt.Sprintf("UNKNOWN(%d)", s)
	}
}

func view(m *primitive.MessageExt) fields {
	props := m.GetProperties()
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sorted := make(map[string]string, len(props))
	for _, k := range keys {
		sorted[k] = props[k]
	}
	delay, _ := strconv.Atoi(props[primitive.PropertyDelayTimeLevel])
	f := fields{"msgId": m.MsgId, "offsetMsgId": m.OffsetMsgId, "topic": m.Topic, "tags": m.GetTags(),
		"keys": m.GetKeys(), "body": string(m.Body), "bodySize": len(m.Body), "properties": sorted,
		"queueOffset": m.QueueOffset, "reconsumeTimes": m.ReconsumeTimes, "bornTimestamp": m.BornTimestamp,
		"storeTimestamp": m.StoreTimestamp, "bornHost": m.BornHost, "storeHost": m.StoreHost,
		"commitLogOffset": m.CommitLogOffset, "sysFlag": m.SysFlag, "delayLevel": delay,
		"receivedAt": time.Now().UnixMilli()}
	if m.Queue != nil {
		f["queueId"], f["brokerName"] = m.Queue.QueueId, m.Queue.BrokerName
	}
	if m.TransactionId != "" {
		f["transactionId"] = m.TransactionId
	}
	return f
}

// ---- send ----

func send(o *options) error {
	opts := []producer.Option{
		producer.WithNameServer([]string{o.namesrv}), producer.WithGroupName(or(o.group, "rocketraft-driver-producer")),
		producer.WithInstanceName(o.instance), producer.WithRetry(o.retries), producer.WithTls(o.tls),
		producer.WithSendMsgTimeout(time.Duration(o.sendTimeoutMs) * time.Millisecond),
		producer.WithCredentials(o.credentials()),
	}
	if o.orderlyKeyCount > 0 {
		opts = append(opts, producer.WithQueueSelector(byOrderKey{}))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err == nil {
		err = p.Start()
	}
	if err != nil {
		return err
	}
	count := o.count
	if o.set["duration-s"] && !o.set["count"] {
		count = int(^uint(0) >> 1)
	}
	deadline := time.Now().Add(time.Duration(1<<62 - 1))
	if o.set["duration-s"] {
		deadline = time.Now().Add(seconds(o.durationS))
	}
	batch := max(o.batch, 1)
	started := time.Now()
	sent, failed := 0, 0
	for index := 0; index < count && time.Now().Before(deadline) && !stopped(); {
		n := min(batch, count-index)
		messages := make([]*primitive.Message, 0, n)
		for j := 0; j < n; j++ {
			m, err := o.message(index + j)
			if err != nil {
				return err
			}
			messages = append(messages, m)
		}
		t0 := time.Now()
		r, err := p.SendSync(context.Background(), messages...)
		latency := time.Since(t0)
		if err == nil {
			ids, offsetIds := strings.Split(r.MsgID, ","), strings.Split(r.OffsetMsgID, ",")
			for j, m := range messages {
				f := receipt(index+j, m, r, latency)
				if n > 1 {
					f["msgId"], f["offsetMsgId"], f["queueOffset"], f["batch"] = at(ids, j), at(offsetIds, j),
						r.QueueOffset+int64(j), n
				}
				emit("sent", f)
			}
			sent += n
		} else {
			for j := 0; j < n; j++ {
				f := errorFields(err)
				f["index"], f["latencyMs"], f["at"] = index+j, float64(latency.Microseconds())/1000, time.Now().UnixMilli()
				emit("send_failed", f)
			}
			failed += n
		}
		index += n
		if o.intervalMs > 0 && pause(time.Duration(o.intervalMs)*time.Millisecond) {
			break
		}
	}
	_ = p.Shutdown()
	emit("summary", fields{"command": "send", "sent": sent, "failed": failed,
		"elapsedMs": float64(time.Since(started).Microseconds()) / 1000})
	return nil
}

func at(list []string, i int) any {
	if i < len(list) && list[i] != "" {
		return list[i]
	}
	return nil
}

func or(v, otherwise string) string {
	if v == "" {
		return otherwise
	}
	return v
}

// ---- transaction ----

type listener struct {
	local, answer primitive.LocalTransactionState
	checked       sync.Map
	checks        atomic.Int32
}

func (l *listener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	return l.local
}

func (l *listener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	id := m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)
	if id == "" {
		id = m.MsgId
	}
	if _, seen := l.checked.LoadOrStore(id, true); !seen {
		l.checks.Add(1)
	}
	f := view(m)
	f["msgId"], f["transactionId"] = id, m.TransactionId
	f["answer"] = map[primitive.LocalTransactionState]string{primitive.CommitMessageState: "COMMIT_MESSAGE",
		primitive.RollbackMessageState: "ROLLBACK_MESSAGE"}[l.answer]
	emit("checked", f)
	return l.answer
}

func transaction(o *options) error {
	l := &listener{answer: primitive.CommitMessageState}
	switch o.resolve {
	case "commit":
		l.local = primitive.CommitMessageState
	case "rollback":
		l.local = primitive.RollbackMessageState
	case "unknown-then-commit":
		l.local = primitive.UnkonwnState
	default:
		return errors.New("--resolve commit|rollback|unknown-then-commit")
	}
	if o.checkAnswer == "rollback" {
		l.answer = primitive.RollbackMessageState
	}
	p, err := rocketmq.NewTransactionProducer(l, producer.WithNameServer([]string{o.namesrv}),
		producer.WithGroupName(or(o.group, "rocketraft-driver-transactions")), producer.WithInstanceName(o.instance),
		producer.WithRetry(o.retries), producer.WithTls(o.tls), producer.WithCredentials(o.credentials()))
	if err == nil {
		err = p.Start()
	}
	if err != nil {
		return err
	}
	started := time.Now()
	sent, failed := 0, 0
	for i := 0; i < o.count && !stopped(); i++ {
		m, err := o.message(i)
		if err != nil {
			return err
		}
		t0 := time.Now()
		r, err := p.SendMessageInTransaction(context.Background(), m)
		if err == nil {
			f := receipt(i, m, r.SendResult, time.Since(t0))
			f["localState"] = map[primitive.LocalTransactionState]string{primitive.CommitMessageState: "COMMIT_MESSAGE",
				primitive.RollbackMessageState: "ROLLBACK_MESSAGE", primitive.UnkonwnState: "UNKNOW"}[r.State]
			emit("sent", f)
			sent++
		} else {
			f := errorFields(err)
			f["index"], f["latencyMs"] = i, float64(time.Since(t0).Microseconds())/1000
			emit("send_failed", f)
			failed++
		}
	}
	timeout := 60.0
	if o.set["timeout-s"] {
		timeout = o.timeoutS
	}
	deadline := time.Now().Add(seconds(timeout))
	if l.local == primitive.UnkonwnState {
		for int(l.checks.Load()) < sent && time.Now().Before(deadline) && !pause(100*time.Millisecond) {
		}
	}
	pause(seconds(o.lingerS))
	_ = p.Shutdown()
	emit("summary", fields{"command": "transaction", "sent": sent, "failed": failed, "checked": l.checks.Load(),
		"elapsedMs": float64(time.Since(started).Microseconds()) / 1000})
	return nil
}

// ---- consumers ----

// tally is what a consumer saw: deliveries per message id, and the ids consumed successfully.
type tally struct {
	mu                                      sync.Mutex
	deliveries                              map[string]int
	consumed                                map[string]bool
	received, duplicates, failFirst, expect int
	done                                    chan struct{}
	doneOnce                                sync.Once
}

func newTally(o *options) *tally {
	return &tally{deliveries: map[string]int{}, consumed: map[string]bool{}, failFirst: o.failFirst,
		expect: o.expect, done: make(chan struct{})}
}

// deliver prints the delivery; true if it is to be consumed, false if it is to be failed (--fail-first).
// The line is printed before the delivery is counted and under the tally's lock, as the Java driver does: once
// `done` closes, push's main goroutine shuts the client down, prints the summary and exits, and a consuming
// goroutine still between counting and printing lost its line (a summary of 20 consumed over 19 printed).
func (t *tally) deliver(m *primitive.MessageExt) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deliveries[m.MsgId]++
	delivery := t.deliveries[m.MsgId]
	ok := delivery > t.failFirst
	f := view(m)
	f["delivery"], f["result"] = delivery, map[bool]string{true: "consumed", false: "failed"}[ok]
	emit("received", f)
	t.received++
	if ok {
		if t.consumed[m.MsgId] {
			t.duplicates++
		}
		t.consumed[m.MsgId] = true
		if t.expect >= 0 && len(t.consumed) >= t.expect {
			t.doneOnce.Do(func() { close(t.done) })
		}
	}
	return ok
}

// await: until --expect messages were consumed, --timeout-s passed or stdin was closed; then --linger-s more.
func (t *tally) await(o *options) {
	var timeout <-chan time.Time
	if o.timeoutS >= 0 {
		timeout = time.After(seconds(o.timeoutS))
	}
	select {
	case <-t.done:
	case <-timeout:
	case <-stdinClosed:
	}
	pause(seconds(o.lingerS))
}

func (t *tally) summary(command string) fields {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fields{"command": command, "received": t.received, "distinct": len(t.deliveries),
		"consumed": len(t.consumed), "duplicates": t.duplicates,
		"complete": t.expect < 0 || len(t.consumed) >= t.expect}
}

func (o *options) selector() consumer.MessageSelector {
	if o.sql != "" {
		return consumer.MessageSelector{Type: consumer.SQL92, Expression: o.sql}
	}
	return consumer.MessageSelector{Type: consumer.TAG, Expression: o.tagExpr}
}

func (o *options) consumerOptions() []consumer.Option {
	from := consumer.ConsumeFromFirstOffset
	if o.from == "last" {
		from = consumer.ConsumeFromLastOffset
	}
	opts := []consumer.Option{consumer.WithNameServer([]string{o.namesrv}), consumer.WithGroupName(o.group),
		consumer.WithInstance(o.instance), consumer.WithConsumeFromWhere(from), consumer.WithTls(o.tls),
		consumer.WithCredentials(o.credentials())}
	if o.maxReconsumeTimes >= 0 {
		opts = append(opts, consumer.WithMaxReconsumeTimes(int32(o.maxReconsumeTimes)))
	}
	return opts
}

func push(o *options) error {
	if o.group == "" || o.topic == "" {
		return errors.New("--topic and --group are required")
	}
	opts := o.consumerOptions()
	if o.broadcast {
		opts = append(opts, consumer.WithConsumerModel(consumer.BroadCasting))
	}
	if o.orderly {
		opts = append(opts, consumer.WithConsumerOrder(true),
			consumer.WithSuspendCurrentQueueTimeMillis(500*time.Millisecond))
	}
	c, err := rocketmq.NewPushConsumer(opts...)
	if err != nil {
		return err
	}
	t := newTally(o)
	err = c.Subscribe(o.topic, o.selector(), func(ctx context.Context, messages ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range messages {
			if !t.deliver(m) {
				if o.orderly {
					return consumer.SuspendCurrentQueueAMoment, nil
				}
				if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
					cc.DelayLevelWhenNextConsume = o.retryDelayLevel
				}
				return consumer.ConsumeRetryLater, nil
			}
		}
		return consumer.ConsumeSuccess, nil
	})
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		return err
	}
	emit("started", fields{"command": "push", "group": o.group})
	t.await(o)
	_ = c.Shutdown()
	emit("summary", t.summary("push"))
	return nil
}

func pull(o *options) error {
	if o.group == "" || o.topic == "" {
		return errors.New("--topic and --group are required")
	}
	c, err := rocketmq.NewPullConsumer(o.consumerOptions()...)
	if err == nil {
		err = c.Subscribe(o.topic, o.selector())
	}
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		return err
	}
	emit("started", fields{"command": "pull", "group": o.group})
	t := newTally(o)
	deadline := time.Now().Add(time.Duration(1<<62 - 1))
	if o.timeoutS >= 0 {
		deadline = time.Now().Add(seconds(o.timeoutS))
	}
	for !stopped() && time.Now().Before(deadline) {
		select {
		case <-t.done:
			deadline = time.Now()
			continue
		default:
		}
		cr, err := c.Poll(context.Background(), 500*time.Millisecond)
		if errors.Is(err, consumer.ErrNoNewMsg) {
			continue
		}
		if err != nil {
			f := errorFields(err)
			f["op"] = "poll"
			emit("error", f)
			pause(500 * time.Millisecond)
			continue
		}
		for _, m := range cr.GetMsgList() {
			t.deliver(m)
		}
		c.ACK(context.Background(), cr, consumer.ConsumeSuccess)
	}
	_ = c.Shutdown()
	emit("summary", t.summary("pull"))
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: remoting-go-driver send|transaction|push|pull --namesrv host:port ... (see main.go)")
		os.Exit(2)
	}
	rlog.SetLogLevel(or(os.Getenv("ROCKETMQ_GO_LOG_LEVEL"), "warn"))
	if path := os.Getenv("REMOTING_DRIVER_LOG"); path != "" {
		_ = rlog.SetOutputPath(path)
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	o, err := parse(os.Args[2:])
	if err == nil {
		switch os.Args[1] {
		case "send":
			err = send(o)
		case "transaction":
			err = transaction(o)
		case "push":
			err = push(o)
		case "pull":
			err = pull(o)
		default:
			err = fmt.Errorf("unknown command %q", os.Args[1])
		}
	}
	if err != nil {
		emit("fatal", errorFields(err))
		os.Exit(1)
	}
}
