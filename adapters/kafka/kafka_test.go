package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/adapters/kafka"
	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/brokertest"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// cluster is the in-process Kafka (kfake) the tests share; cut makes it
// close every client connection on its next request, an outage.
var (
	cluster *kfake.Cluster
	cut     atomic.Bool
)

func TestMain(m *testing.M) {
	var err error
	if cluster, err = kfake.NewCluster(kfake.NumBrokers(1)); err != nil {
		panic(err)
	}
	cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		if !cut.Load() {
			return nil, nil, false
		}
		cluster.KeepControl()
		return nil, errors.New("cut off"), true
	})
	code := dbtest.Main(m).Run()
	cluster.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// newTopic creates a topic of three partitions of its own for t, deleted
// when t ends.
func newTopic(t testing.TB) string {
	name := brokertest.Name(t, "ls.")
	if err := cluster.CreateTopic(name, 3, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.DeleteTopic(name); err != nil {
			t.Errorf("delete topic %s: %v", name, err)
		}
	})
	return name
}

func newClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordDeliveryTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func newPublisher(t testing.TB, cl *kgo.Client, ackTimeout time.Duration) *kafka.Publisher {
	p, err := kafka.NewPublisher(cl, kafka.PublisherOptions{AckTimeout: ackTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// broker is the adapter under the shared scenarios. Kafka's metadata names
// the broker's own address, so the outage cuts the cluster itself.
func broker() brokertest.Broker {
	return brokertest.Broker{
		Addr:        cluster.ListenAddrs()[0],
		Destination: newTopic,
		Publisher: func(t testing.TB, addr, topic string, relay processor.Options) processor.BatchPublisher {
			cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordDeliveryTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			p, err := kafka.NewPublisher(cl, kafka.PublisherOptions{AckTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return p.PublishBatch
		},
		BarePublish: func(tb testing.TB, topic string, n int) {
			cl := newClient(tb)
			var failed atomic.Value
			for range n {
				cl.Produce(tb.Context(), &kgo.Record{Topic: topic, Value: []byte(`{"seq":1}`)}, func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Store(err)
					}
				})
			}
			if err := cl.Flush(tb.Context()); err != nil {
				tb.Fatal(err)
			}
			if err := failed.Load(); err != nil {
				tb.Fatal(err)
			}
		},
		Consume: func(ctx context.Context, addr, topic string, inbox brokermsg.Enqueuer) error {
			cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("inbox."+topic), kgo.ConsumeTopics(topic),
				kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				return err
			}
			defer cl.Close()
			c, err := kafka.NewConsumer(cl, inbox, kafka.ConsumerOptions{RetryDelay: 100 * time.Millisecond})
			if err != nil {
				return err
			}
			return c.Run(ctx)
		},
		Cutter: func(t testing.TB) (string, func(), func()) {
			t.Cleanup(func() { cut.Store(false) })
			return cluster.ListenAddrs()[0], func() { cut.Store(true) }, func() { cut.Store(false) }
		},
	}
}

func TestRoundTrip(t *testing.T) { t.Parallel(); brokertest.RoundTrip(t, broker(), 100) }
func TestRelayKilled(t *testing.T) {
	t.Parallel()
	brokertest.RelayKilled(t, broker(), 100, "TestRelayChild")
}
func TestRelayChild(t *testing.T) { brokertest.RelayChild(t, broker()) }

// TestBrokerOutage cuts the whole cluster: the scenarios running beside it
// ride out the same outage, which they must survive as well.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	brokertest.Outage(t, broker(), 100, time.Second)
}

// BenchmarkRelay compares the relay with the batch publisher to a bare
// produce loop of franz-go on kfake (docs/notes/2026-12-03-brokers.md).
func BenchmarkRelay(b *testing.B) { brokertest.Bench(b, broker(), 2000) }

// An unknown topic and a record too large are permanent, a cut-off broker
// unavailable; the record carries its key and headers.
//
// The broker's answers decide the first cases, so their publisher waits
// long enough for them: franz-go fails an unknown topic only after a
// second metadata request, 250 ms after the first (its quick metadata
// backoff), and a produce to a topic the client has not yet loaded waits
// out that backoff too. Under a 500 ms ack timeout a loaded machine turned
// them into Unavailable. A cut-off broker is found by the timeout itself:
// that publisher's stays short.
func TestPublishErrorClasses(t *testing.T) {
	topic := newTopic(t)
	cl := newClient(t, kgo.ProducerBatchMaxBytes(1000), kgo.UnknownTopicRetries(1), kgo.RecordDeliveryTimeout(10*time.Second))
	p := newPublisher(t, cl, 10*time.Second)
	ok := leasing.Message{ID: uuid.New(), Topic: topic, OrderingKey: "order-7", Type: "order.placed", Payload: []byte("ok"),
		Headers: []byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)}
	for name, c := range map[string]struct {
		msg  leasing.Message
		want processor.Verdict
	}{
		"no topic":      {leasing.Message{ID: uuid.New()}, processor.VerdictPermanent},
		"unknown topic": {leasing.Message{ID: uuid.New(), Topic: "no.such." + topic}, processor.VerdictPermanent},
		"too large":     {leasing.Message{ID: uuid.New(), Topic: topic, Payload: make([]byte, 2000)}, processor.VerdictPermanent},
		"produced":      {ok, processor.VerdictRetry},
	} {
		err := p.Publish(t.Context(), c.msg)
		if got := brokertest.Verdict(err); got != c.want || (c.want == processor.VerdictRetry) != (err == nil) {
			t.Errorf("%s: Publish = %v (%s), want %s", name, err, got, c.want)
		}
	}

	consumer := newClient(t, kgo.ConsumeTopics(topic))
	fetches := consumer.PollRecords(t.Context(), 1)
	recs := fetches.Records()
	if len(recs) != 1 {
		t.Fatalf("polled %d records, errors %v", len(recs), fetches.Errors())
	}
	hs := map[string]string{}
	for _, h := range recs[0].Headers {
		hs[h.Key] = string(h.Value)
	}
	if string(recs[0].Key) != "order-7" || hs[kafka.HeaderMessageID] != ok.ID.String() || hs[kafka.HeaderType] != "order.placed" ||
		hs[leasing.HeaderTraceParent] == "" {
		t.Fatalf("record key %q, headers %v", recs[0].Key, hs)
	}

	cut.Store(true)
	defer cut.Store(false)
	short := newPublisher(t, cl, 500*time.Millisecond)
	if err := short.Publish(t.Context(), leasing.Message{ID: uuid.New(), Topic: topic}); brokertest.Verdict(err) != processor.VerdictUnavailable {
		t.Errorf("Publish to a cut-off broker = %v, want unavailable", err)
	}
}

// A client without the idempotent producer or acks=all is refused, and so
// is a consumer client that commits by itself.
func TestNewRefusesUnsafeClients(t *testing.T) {
	cl := newClient(t, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck()))
	if _, err := kafka.NewPublisher(cl, kafka.PublisherOptions{}); !errors.Is(err, leasing.ErrInvalidArgument) {
		t.Errorf("NewPublisher without idempotence = %v, want ErrInvalidArgument", err)
	}
	auto := newClient(t, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))
	if _, err := kafka.NewConsumer(auto, noInbox{}, kafka.ConsumerOptions{}); !errors.Is(err, leasing.ErrInvalidArgument) {
		t.Errorf("NewConsumer with auto commit = %v, want ErrInvalidArgument", err)
	}
}

type noInbox struct{}

func (noInbox) Enqueue(context.Context, ...leasing.NewMessage) (leasing.EnqueueResult, error) {
	return leasing.EnqueueResult{}, errors.New("not used")
}

// A failed enqueue is tried again before the offsets are committed; a
// record the inbox refuses is skipped and its offset committed.
func TestConsumerRetriesFailedEnqueueAndSkipsRefused(t *testing.T) {
	topic := newTopic(t)
	producer := newClient(t)
	for _, r := range []*kgo.Record{
		{Topic: topic, Key: []byte("k"), Value: []byte("good"), Headers: []kgo.RecordHeader{{Key: kafka.HeaderMessageID, Value: []byte("good-1")}}},
		{Topic: topic, Key: []byte("k"), Headers: []kgo.RecordHeader{{Key: kafka.HeaderTenantID, Value: make([]byte, 10_000)}}}, // longer than a tenant id may be
	} {
		if err := producer.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	inbox := brokertest.MemoryInbox(t)
	var skipped atomic.Int64
	group := "inbox." + topic
	cl := newClient(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond))
	c, err := kafka.NewConsumer(cl, &brokertest.FlakyInbox{Enqueuer: inbox}, kafka.ConsumerOptions{RetryDelay: 50 * time.Millisecond,
		OnError: func(err error) {
			if brokermsg.IsPermanent(err) {
				skipped.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	stop := brokertest.RunConsumer(t, c.Run)
	admin := kmsg.NewOffsetFetchRequest()
	admin.Group = group
	brokertest.Await(t, func() (bool, string) {
		st, _ := inbox.Stats(t.Context())
		committed := int64(0)
		if resp, err := admin.RequestWith(t.Context(), producer); err == nil {
			for _, tp := range resp.Topics {
				for _, p := range tp.Partitions {
					committed += max(p.Offset, 0)
				}
			}
		}
		return st.Depth[leasing.StatusPending] == 1 && skipped.Load() == 1 && committed == 2,
			fmt.Sprintf("inbox %v, %d skipped, %d offsets committed", st.Depth, skipped.Load(), committed)
	})
	stop()
	brokertest.InboxHoldsOnce(t, inbox, "good-1", "good")
}
