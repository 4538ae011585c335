package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/adapters/natsjs"
	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/brokertest"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dbtest.Main(m))
}

// natsAddr is the JetStream server the tests use: NATS_ADDR, else the
// local one .ci/run starts.
func natsAddr() string { return brokertest.Addr("NATS_ADDR", "127.0.0.1:4222") }

// connect returns a connection to addr that reconnects for ever, closed
// when t ends. It skips without a server, or fails under CI=true.
func connect(t testing.TB, addr string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.Timeout(time.Second))
	if err == nil && !waitConnected(nc) {
		nc.Close()
		err = errors.New("not connected after 5s")
	}
	if err != nil {
		brokertest.Unreachable(t, "NATS", addr, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitConnected(nc *nats.Conn) bool {
	for range 100 {
		if nc.IsConnected() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// newStream creates a stream of its own for t taking "<name>.>", with the
// given duplicate window, deleted when t ends.
func newStream(t testing.TB, window time.Duration, maxMsgSize int32) (name, subject string) {
	t.Helper()
	nc := connect(t, natsAddr())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name = brokertest.Name(t, "LS")
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Duplicates: window, Storage: jetstream.MemoryStorage,
		MaxMsgSize: maxMsgSize,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), name); err != nil {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return name, name + ".events"
}

// broker is the adapter under the shared scenarios.
func broker() brokertest.Broker {
	streamOf := func(subject string) string { return strings.TrimSuffix(subject, ".events") }
	return brokertest.Broker{
		Addr:   natsAddr(),
		Dedups: true,
		Destination: func(t testing.TB) string {
			_, subject := newStream(t, 10*time.Minute, 0)
			return subject
		},
		Publisher: func(t testing.TB, addr, subject string, relay processor.Options) processor.BatchPublisher {
			p, err := natsjs.NewPublisher(t.Context(), connect(t, addr), natsjs.PublisherOptions{
				Streams: []string{streamOf(subject)}, Relay: relay, AckTimeout: time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			return p.PublishBatch
		},
		Consume: func(ctx context.Context, addr, subject string, inbox brokermsg.Enqueuer) error {
			nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := natsjs.NewConsumer(ctx, nc, inbox, natsjs.ConsumerOptions{
				Stream: streamOf(subject), Durable: "inbox", NakDelay: 100 * time.Millisecond,
			})
			if err != nil {
				return err
			}
			return c.Run(ctx)
		},
		BarePublish: func(tb testing.TB, subject string, n int) {
			js, err := jetstream.New(connect(tb, natsAddr()))
			if err != nil {
				tb.Fatal(err)
			}
			futures := make([]jetstream.PubAckFuture, n)
			for i := range futures {
				m := nats.NewMsg(subject)
				m.Data = []byte(`{"seq":1}`)
				if futures[i], err = js.PublishMsgAsync(m, jetstream.WithMsgID(uuid.NewString())); err != nil {
					tb.Fatal(err)
				}
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					tb.Fatal(err)
				}
			}
		},
		Stored: func(t testing.TB, subject string) int {
			js, err := jetstream.New(connect(t, natsAddr()))
			if err != nil {
				t.Fatal(err)
			}
			s, err := js.Stream(t.Context(), streamOf(subject))
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return int(info.State.Msgs)
		},
	}
}

func TestRoundTrip(t *testing.T) { t.Parallel(); brokertest.RoundTrip(t, broker(), 100) }
func TestRelayKilled(t *testing.T) {
	t.Parallel()
	brokertest.RelayKilled(t, broker(), 100, "TestRelayChild")
}
func TestRelayChild(t *testing.T) { brokertest.RelayChild(t, broker()) }
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	brokertest.Outage(t, broker(), 100, time.Second)
}

// BenchmarkRelay compares the relay with the batch publisher to a bare
// async publish loop of nats.go (docs/notes/2026-12-03-brokers.md).
func BenchmarkRelay(b *testing.B) { brokertest.Bench(b, broker(), 2000) }

// A stream whose duplicate window is shorter than lease + longest retry
// delay is refused with a *DuplicateWindowError naming it.
func TestNewPublisherRefusesShortDuplicateWindow(t *testing.T) {
	stream, _ := newStream(t, time.Minute, 0)
	nc := connect(t, natsAddr())
	relay := processor.Options{LeaseDuration: 30 * time.Second, RetryPolicy: processor.RetryPolicy{MaxDelay: time.Minute}}
	_, err := natsjs.NewPublisher(t.Context(), nc, natsjs.PublisherOptions{Streams: []string{stream}, Relay: relay})
	var dw *natsjs.DuplicateWindowError
	if !errors.As(err, &dw) || dw.Stream != stream || dw.Window != time.Minute || dw.Required != 90*time.Second {
		t.Fatalf("NewPublisher = %v, want a DuplicateWindowError for %s (1m < 1m30s)", err, stream)
	}
	relay.RetryPolicy.MaxDelay = 30 * time.Second
	if _, err := natsjs.NewPublisher(t.Context(), nc, natsjs.PublisherOptions{Streams: []string{stream}, Relay: relay}); err != nil {
		t.Fatalf("NewPublisher with a window of exactly lease + max delay: %v", err)
	}
	if got := natsjs.RequiredDuplicateWindow(processor.Options{}); got != processor.DefaultLeaseDuration+processor.DefaultMaxDelay {
		t.Fatalf("RequiredDuplicateWindow of the defaults = %s", got)
	}
	if _, err := natsjs.NewPublisher(t.Context(), nc, natsjs.PublisherOptions{}); !errors.Is(err, leasing.ErrInvalidArgument) {
		t.Fatalf("NewPublisher without streams = %v, want ErrInvalidArgument", err)
	}
}

// A message published twice is stored once, and the duplicate's ack
// counts as published; its headers carry the ordering key and the trace
// context.
func TestPublishDuplicateCountsAsPublished(t *testing.T) {
	stream, subject := newStream(t, 10*time.Minute, 0)
	nc := connect(t, natsAddr())
	p, err := natsjs.NewPublisher(t.Context(), nc, natsjs.PublisherOptions{Streams: []string{stream}})
	if err != nil {
		t.Fatal(err)
	}
	msg := leasing.Message{ID: uuid.New(), Topic: subject, Type: "order.placed", OrderingKey: "order-7", Payload: []byte("x"),
		Headers: []byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","n":1}`)}
	if err := p.Publish(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	for i, err := range p.PublishBatch(t.Context(), []leasing.Message{msg, msg}) {
		if err != nil {
			t.Fatalf("duplicate %d: %v", i, err)
		}
	}
	js, _ := jetstream.New(nc)
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetLastMsgForSubject(t.Context(), subject)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(t.Context())
	if info.State.Msgs != 1 || got.Sequence != 1 {
		t.Fatalf("stream holds %d messages, last sequence %d; want 1", info.State.Msgs, got.Sequence)
	}
	for k, want := range map[string]string{
		"Nats-Msg-Id": msg.ID.String(), natsjs.HeaderOrderingKey: "order-7", natsjs.HeaderType: "order.placed",
		leasing.HeaderTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": "1",
	} {
		if v := got.Header.Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
}

// No stream for the subject and a message above the stream's size limit
// are permanent; a closed connection is unavailable.
func TestPublishErrorClasses(t *testing.T) {
	stream, subject := newStream(t, 10*time.Minute, 512)
	nc := connect(t, natsAddr())
	p, err := natsjs.NewPublisher(t.Context(), nc, natsjs.PublisherOptions{Streams: []string{stream}, AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		msg  leasing.Message
		want processor.Verdict
	}{
		"no stream": {leasing.Message{ID: uuid.New(), Topic: "nostream." + stream}, processor.VerdictPermanent},
		"too large": {leasing.Message{ID: uuid.New(), Topic: subject, Payload: make([]byte, 1000)}, processor.VerdictPermanent},
		"no topic":  {leasing.Message{ID: uuid.New()}, processor.VerdictPermanent},
		"fits":      {leasing.Message{ID: uuid.New(), Topic: subject, Payload: []byte("ok")}, processor.VerdictRetry},
	} {
		err := p.Publish(t.Context(), c.msg)
		if got := brokertest.Verdict(err); got != c.want || (c.want == processor.VerdictRetry) != (err == nil) {
			t.Errorf("%s: Publish = %v (%s), want %s", name, err, got, c.want)
		}
		if got := brokertest.Verdict(p.PublishBatch(t.Context(), []leasing.Message{c.msg})[0]); got != c.want {
			t.Errorf("%s: PublishBatch verdict %s, want %s", name, got, c.want)
		}
	}
	nc.Close()
	msg := leasing.Message{ID: uuid.New(), Topic: subject}
	if err := p.Publish(t.Context(), msg); brokertest.Verdict(err) != processor.VerdictUnavailable {
		t.Errorf("Publish on a closed connection = %v, want unavailable", err)
	}
	if err := p.PublishBatch(t.Context(), []leasing.Message{msg})[0]; brokertest.Verdict(err) != processor.VerdictUnavailable {
		t.Errorf("PublishBatch on a closed connection = %v, want unavailable", err)
	}
}

// A failed enqueue naks the message, which comes back and is enqueued
// once; a message the inbox refuses is terminated, not redelivered.
func TestConsumerNaksFailedEnqueueAndTerminatesRefused(t *testing.T) {
	stream, subject := newStream(t, 10*time.Minute, 0)
	nc := connect(t, natsAddr())
	js, _ := jetstream.New(nc)
	good := nats.NewMsg(subject)
	good.Data = []byte("good")
	if _, err := js.PublishMsg(t.Context(), good, jetstream.WithMsgID("good-1")); err != nil {
		t.Fatal(err)
	}
	bad := nats.NewMsg(subject)
	bad.Header.Set(natsjs.HeaderTenantID, strings.Repeat("t", 10_000)) // longer than a tenant id may be
	if _, err := js.PublishMsg(t.Context(), bad, jetstream.WithMsgID("bad-1")); err != nil {
		t.Fatal(err)
	}

	inbox := brokertest.MemoryInbox(t)
	var terminated atomic.Int64
	c, err := natsjs.NewConsumer(t.Context(), nc, &brokertest.FlakyInbox{Enqueuer: inbox}, natsjs.ConsumerOptions{
		Stream: stream, Durable: "inbox", FetchSize: 1, NakDelay: 50 * time.Millisecond,
		OnError: func(err error) {
			if brokermsg.IsPermanent(err) {
				terminated.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := brokertest.RunConsumer(t, c.Run)
	cons, _ := js.Consumer(t.Context(), stream, "inbox")
	brokertest.Await(t, func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		st, _ := inbox.Stats(t.Context())
		return info.NumPending == 0 && info.NumAckPending == 0 && st.Depth[leasing.StatusPending] == 1,
			fmt.Sprintf("consumer info %+v, inbox %v", info, st.Depth)
	})
	stop()
	if terminated.Load() != 1 {
		t.Fatalf("%d messages terminated, want the refused one", terminated.Load())
	}
	brokertest.InboxHoldsOnce(t, inbox, "good-1", "good")
}

// A publish whose ack does not come in AckTimeout (the server cut off
// while the client buffers for its reconnect) is unavailable.
func TestPublishWithoutAckIsUnavailable(t *testing.T) {
	stream, subject := newStream(t, 10*time.Minute, 0)
	proxy := brokertest.NewProxy(t, natsAddr())
	p, err := natsjs.NewPublisher(t.Context(), connect(t, proxy.Addr()), natsjs.PublisherOptions{
		Streams: []string{stream}, AckTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	msg := leasing.Message{ID: uuid.New(), Topic: subject}
	if err := p.Publish(t.Context(), msg); brokertest.Verdict(err) != processor.VerdictUnavailable {
		t.Errorf("Publish while cut off = %v, want unavailable", err)
	}
	for i, err := range p.PublishBatch(t.Context(), []leasing.Message{msg, {ID: uuid.New(), Topic: subject}}) {
		if brokertest.Verdict(err) != processor.VerdictUnavailable {
			t.Errorf("PublishBatch message %d while cut off = %v, want unavailable", i, err)
		}
	}
}
