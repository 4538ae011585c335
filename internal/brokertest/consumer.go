package brokertest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/leasing"
)

// FlakyInbox fails its first Enqueue call as a store outage would, then
// passes the calls to Enqueuer: a consumer must bring the message the
// failed call carried back and enqueue it once.
type FlakyInbox struct {
	brokermsg.Enqueuer
	failed atomic.Bool
}

// Enqueue fails the first call with a connection error, without calling
// f.Enqueuer, and passes every later call to f.Enqueuer.
func (f *FlakyInbox) Enqueue(ctx context.Context, msgs ...leasing.NewMessage) (leasing.EnqueueResult, error) {
	if f.failed.CompareAndSwap(false, true) {
		return leasing.EnqueueResult{}, errors.New("connection refused")
	}
	return f.Enqueuer.Enqueue(ctx, msgs...)
}

// MemoryInbox returns an empty in-memory inbox for a consumer test.
func MemoryInbox(t testing.TB) *leasing.Memory {
	t.Helper()
	inbox, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}

// RunConsumer runs run (a consumer's Run) in a goroutine until the
// returned stop is called; stop cancels run's context, waits for run to
// return and fails t with the error it returned.
func RunConsumer(t testing.TB, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// Await calls cond every 20ms until it reports done, and fails t with the
// state cond last reported when it has not after 10 seconds.
func Await(t testing.TB, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// InboxHoldsOnce claims every message of inbox and fails t unless it
// holds exactly one: the one with idempotency key key and payload payload.
func InboxHoldsOnce(t testing.TB, inbox leasing.Store, key, payload string) {
	t.Helper()
	leases, err := inbox.Claim(t.Context(), leasing.ClaimRequest{Owner: "t", BatchSize: 10, LeaseFor: time.Minute})
	if err != nil || len(leases) != 1 || leases[0].Message.IdempotencyKey != key || string(leases[0].Message.Payload) != payload {
		t.Fatalf("inbox leases %+v, %v; want the message %s (payload %q) once", leases, err, key, payload)
	}
}
