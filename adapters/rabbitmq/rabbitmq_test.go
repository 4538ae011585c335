package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/adapters/rabbitmq"
	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/brokertest"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dbtest.Main(m))
}

// rabbitAddr is the broker the tests use: RABBITMQ_ADDR, else the local
// one .ci/run starts (guest/guest).
func rabbitAddr() string { return brokertest.Addr("RABBITMQ_ADDR", "127.0.0.1:5672") }

func amqpURL(addr string) string { return "amqp://guest:guest@" + addr + "/" }

// newQueue declares a durable queue of its own for t, deleted when t ends.
// It skips without a broker, or fails under CI=true.
func newQueue(t testing.TB) string {
	t.Helper()
	conn, err := amqp.Dial(amqpURL(rabbitAddr()))
	if err != nil {
		brokertest.Unreachable(t, "RabbitMQ", rabbitAddr(), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := brokertest.Name(t, "ls.")
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(name, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", name, err)
		}
		_ = conn.Close()
	})
	return name
}

// channel opens a channel on the broker beside the adapter's own, to
// publish or get messages directly; its connection closes when t ends.
func channel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURL(rabbitAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func newPublisher(t testing.TB, opts rabbitmq.PublisherOptions) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// broker is the adapter under the shared scenarios.
func broker() brokertest.Broker {
	return brokertest.Broker{
		Addr:        rabbitAddr(),
		Destination: newQueue,
		Publisher: func(t testing.TB, addr, queue string, relay processor.Options) processor.BatchPublisher {
			return newPublisher(t, rabbitmq.PublisherOptions{URL: amqpURL(addr), ConfirmTimeout: time.Second}).PublishBatch
		},
		BarePublish: func(tb testing.TB, queue string, n int) {
			conn, err := amqp.Dial(amqpURL(rabbitAddr()))
			if err != nil {
				tb.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				tb.Fatal(err)
			}
			confirms := make([]*amqp.DeferredConfirmation, n)
			for i := range confirms {
				if confirms[i], err = ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
					DeliveryMode: amqp.Persistent, MessageId: uuid.NewString(), Body: []byte(`{"seq":1}`),
				}); err != nil {
					tb.Fatal(err)
				}
			}
			for _, dc := range confirms {
				if !dc.Wait() {
					tb.Fatal("nacked")
				}
			}
		},
		Consume: func(ctx context.Context, addr, queue string, inbox brokermsg.Enqueuer) error {
			c, err := rabbitmq.NewConsumer(inbox, rabbitmq.ConsumerOptions{URL: amqpURL(addr), Queue: queue, RetryDelay: 100 * time.Millisecond})
			if err != nil {
				return err
			}
			return c.Run(ctx)
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
// confirmed publish loop of amqp091-go (docs/notes/2026-12-03-brokers.md).
func BenchmarkRelay(b *testing.B) { brokertest.Bench(b, broker(), 2000) }

// An unroutable message and a missing exchange are permanent; the channel
// the missing exchange closed is opened again for the next publish.
func TestPublishErrorClasses(t *testing.T) {
	queue := newQueue(t)
	p := newPublisher(t, rabbitmq.PublisherOptions{URL: amqpURL(rabbitAddr())})
	ok := leasing.Message{ID: uuid.New(), Topic: queue, Payload: []byte("ok")}
	for name, c := range map[string]struct {
		msg  leasing.Message
		want processor.Verdict
	}{
		"unroutable": {leasing.Message{ID: uuid.New(), Topic: "no.such.queue." + queue}, processor.VerdictPermanent},
		"no topic":   {leasing.Message{ID: uuid.New()}, processor.VerdictPermanent},
		"routed":     {ok, processor.VerdictRetry},
	} {
		err := p.Publish(t.Context(), c.msg)
		if got := brokertest.Verdict(err); got != c.want || (c.want == processor.VerdictRetry) != (err == nil) {
			t.Errorf("%s: Publish = %v (%s), want %s", name, err, got, c.want)
		}
	}
	noExchange := newPublisher(t, rabbitmq.PublisherOptions{URL: amqpURL(rabbitAddr()), Exchange: "no.such.exchange." + queue})
	for range 2 { // the second publish runs on a channel opened again
		if err := noExchange.Publish(t.Context(), ok); brokertest.Verdict(err) != processor.VerdictPermanent {
			t.Errorf("Publish to a missing exchange = %v, want permanent", err)
		}
	}
	if err := p.Publish(t.Context(), ok); err != nil {
		t.Errorf("Publish after the others: %v", err)
	}
}

// A lost connection is unavailable, and the next publish dials again.
func TestPublisherReconnects(t *testing.T) {
	queue := newQueue(t)
	proxy := brokertest.NewProxy(t, rabbitAddr())
	p := newPublisher(t, rabbitmq.PublisherOptions{URL: amqpURL(proxy.Addr()), ConfirmTimeout: time.Second})
	msg := leasing.Message{ID: uuid.New(), Topic: queue, Type: "order.placed", OrderingKey: "order-7",
		Headers: []byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)}
	if err := p.Publish(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	if errs := p.PublishBatch(t.Context(), []leasing.Message{msg, msg}); brokertest.Verdict(errs[0]) != processor.VerdictUnavailable || brokertest.Verdict(errs[1]) != processor.VerdictUnavailable {
		t.Fatalf("PublishBatch through a cut connection = %v, want unavailable", errs)
	}
	proxy.Restore()
	if err := p.Publish(t.Context(), msg); err != nil {
		t.Fatalf("Publish after the connection came back: %v", err)
	}

	d, ok, err := channel(t).Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	if d.MessageId != msg.ID.String() || d.DeliveryMode != amqp.Persistent || d.Type != "order.placed" ||
		d.Headers[rabbitmq.HeaderOrderingKey] != "order-7" || d.Headers[leasing.HeaderTraceParent] == nil {
		t.Fatalf("delivered message-id %q, mode %d, type %q, headers %v", d.MessageId, d.DeliveryMode, d.Type, d.Headers)
	}
	if _, err := rabbitmq.NewPublisher(rabbitmq.PublisherOptions{}); !errors.Is(err, leasing.ErrInvalidArgument) {
		t.Fatalf("NewPublisher without a URL = %v", err)
	}
}

// A failed enqueue requeues the delivery, which comes back and is
// enqueued once; a delivery the inbox refuses is rejected, not requeued.
func TestConsumerRequeuesFailedEnqueueAndRejectsRefused(t *testing.T) {
	queue := newQueue(t)
	ch := channel(t)
	for _, p := range []amqp.Publishing{
		{MessageId: "good-1", Body: []byte("good")},
		{MessageId: "bad-1", Headers: amqp.Table{rabbitmq.HeaderTenantID: strings.Repeat("t", 10_000)}}, // longer than a tenant id may be
	} {
		if err := ch.PublishWithContext(t.Context(), "", queue, false, false, p); err != nil {
			t.Fatal(err)
		}
	}

	inbox := brokertest.MemoryInbox(t)
	var rejected atomic.Int64
	c, err := rabbitmq.NewConsumer(&brokertest.FlakyInbox{Enqueuer: inbox}, rabbitmq.ConsumerOptions{
		URL: amqpURL(rabbitAddr()), Queue: queue, Prefetch: 1, RetryDelay: 50 * time.Millisecond,
		OnError: func(err error) {
			if brokermsg.IsPermanent(err) {
				rejected.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := brokertest.RunConsumer(t, c.Run)
	brokertest.Await(t, func() (bool, string) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := inbox.Stats(t.Context())
		return q.Messages == 0 && rejected.Load() == 1 && st.Depth[leasing.StatusPending] == 1,
			fmt.Sprintf("queue holds %d ready messages, %d rejected, inbox %v", q.Messages, rejected.Load(), st.Depth)
	})
	stop()
	brokertest.InboxHoldsOnce(t, inbox, "good-1", "good")
	if q, _ := ch.QueueDeclarePassive(queue, true, false, false, false, nil); q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("after Run: %d messages, %d consumers; want the refused one gone", q.Messages, q.Consumers)
	}
}
