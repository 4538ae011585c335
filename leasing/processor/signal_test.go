package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// countingStore counts the claims and vacuum-policy checks a processor
// sends; it is a Vacuumer, so the processor runs its vacuum policy on it.
type countingStore struct {
	leasing.Store
	claims, vacuumChecks atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, r)
}

func (s *countingStore) VacuumIfDead(context.Context, int64) (leasing.Vacuum, error) {
	s.vacuumChecks.Add(1)
	return leasing.Vacuum{}, nil
}

// silent is a WorkSignal that never wakes: what a processor sees when the
// notification of its message was lost or its listener is away.
func silent() processor.WakeChan { return processor.WakeChan(make(chan struct{})) }

// TestPollIntervalDefaultWithSignal: PollInterval defaults to 1 s without
// a WorkSignal and to DefaultSignalledPollInterval with one; a bad one is
// an ArgumentError either way.
func TestPollIntervalDefaultWithSignal(t *testing.T) {
	b := setupProcessor(t, leasing.Inbox)
	ok := func(context.Context, leasing.Lease) error { return nil }
	p, err := processor.New(b.mem, ok, processor.Options{})
	require.NoError(t, err)
	require.Equal(t, processor.DefaultPollInterval, p.Options().PollInterval)
	p, err = processor.New(b.mem, ok, processor.Options{WorkSignal: silent()})
	require.NoError(t, err)
	require.Equal(t, processor.DefaultSignalledPollInterval, p.Options().PollInterval)
	_, err = processor.New(b.mem, ok, processor.Options{WorkSignal: silent(), PollInterval: -time.Second})
	var ae *leasing.ArgumentError
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}

// TestSignalledPollBacksOff: with a WorkSignal, after a claim that found
// work the processor claims again a few times at short intervals (rows
// committed just after a wake) and then only once per PollInterval; a
// message that no signal announces is still claimed by that poll.
func TestSignalledPollBacksOff(t *testing.T) {
	b := setupProcessor(t, leasing.Inbox)
	store := &countingStore{Store: b.mem}
	const ceiling = 300 * time.Millisecond
	handled := make(chan struct{}, 10)
	b.start(t, store, func(context.Context, leasing.Lease) error { handled <- struct{}{}; return nil },
		processor.Options{PollInterval: ceiling, WorkSignal: silent(), Vacuum: processor.VacuumPolicy{Disabled: true}})

	// The first claim at start finds nothing; the second, a poll, finds
	// the message.
	b.enqueue(t, 1)
	select {
	case <-handled:
	case <-time.After(ceiling + 5*time.Second):
		t.Fatal("a message no signal announced was not claimed by the poll")
	}
	// Over the next 1.2 s: at most 6 short claims (2 ... 64 ms) and one
	// per ceiling, with slack for a slow machine. A processor that kept
	// polling at the short interval would send hundreds.
	mark := store.claims.Load()
	time.Sleep(4 * ceiling)
	require.LessOrEqual(t, store.claims.Load()-mark, int64(6+4+3), "an idle processor backs off to PollInterval")

	// Idle at the ceiling, a new unannounced message is found by the poll.
	b.enqueue(t, 1)
	select {
	case <-handled:
	case <-time.After(ceiling + 5*time.Second):
		t.Fatal("an idle processor's poll did not find the message")
	}
}

// TestVacuumChecksOnlyAfterWrites: an idle processor does not read the
// dead-row count; after it claimed and completed a message it does, and
// then stops again.
func TestVacuumChecksOnlyAfterWrites(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	store := &countingStore{Store: b.mem}
	b.start(t, store, func(context.Context, leasing.Lease) error { return nil },
		processor.Options{PollInterval: 5 * time.Millisecond, Vacuum: processor.VacuumPolicy{CheckInterval: 5 * time.Millisecond}})
	waitFor(t, func() bool { return store.claims.Load() >= 20 }, "the processor polls")
	require.Zero(t, store.vacuumChecks.Load(), "no vacuum check while the processor wrote nothing")

	id := b.enqueue(t, 1)[0]
	waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "message handled")
	waitFor(t, func() bool { return store.vacuumChecks.Load() >= 1 }, "a vacuum check after the writes")
	// The policy goes on checking for 11 s after the last write (the
	// statistics' delay, vacuumStatsLag), then stops.
	time.Sleep(11300 * time.Millisecond)
	settled := store.vacuumChecks.Load()
	require.Greater(t, settled, int64(1), "checks go on while the last writes' dead rows reach the statistics")
	claims := store.claims.Load()
	time.Sleep(100 * time.Millisecond) // 20 check intervals
	require.Greater(t, store.claims.Load(), claims, "still polling")
	require.Equal(t, settled, store.vacuumChecks.Load(), "no vacuum check while idle again")
}

// TestKeyedSuccessorClaimedWithoutWaitingForThePoll: completing a keyed
// head promotes the next message of its key, which no insert announces;
// the processor claims it at once, not at its next poll (here an hour
// away, with a signal that never wakes).
func TestKeyedSuccessorClaimedWithoutWaitingForThePoll(t *testing.T) {
	b := setupProcessor(t, leasing.Inbox)
	msgs := make([]leasing.NewMessage, 3)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "t", OrderingKey: "order-1", Payload: fmt.Appendf(nil, "e%d", i)}
	}
	res, err := b.mem.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	var order []string
	var mu sync.Mutex
	b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
		// Longer than the short repolls after a claim that found work
		// (126 ms in all), so that only the completion can bring the
		// next claim forward.
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		order = append(order, string(l.Message.Payload))
		mu.Unlock()
		return nil
	}, processor.Options{PollInterval: time.Hour, WorkSignal: silent(), Vacuum: processor.VacuumPolicy{Disabled: true}})
	for _, id := range res.IDs {
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "each message of the key handled without waiting for the poll")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"e0", "e1", "e2"}, order)
}

// TestDeadLetteredKeyedHeadSuccessorClaimedAtOnce: a keyed head that
// fails on its last attempt is dead-lettered, which frees its key
// (strict ordering off) and promotes the next message; the processor
// claims it at once, not at its next poll.
func TestDeadLetteredKeyedHeadSuccessorClaimedAtOnce(t *testing.T) {
	b := setupProcessor(t, leasing.Inbox)
	res, err := b.mem.Enqueue(context.Background(),
		leasing.NewMessage{Type: "t", OrderingKey: "order-1", Payload: []byte("poison")},
		leasing.NewMessage{Type: "t", OrderingKey: "order-1", Payload: []byte("next")})
	require.NoError(t, err)
	b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
		time.Sleep(200 * time.Millisecond) // past the short repolls, as above
		if string(l.Message.Payload) == "poison" {
			return errors.New("poison")
		}
		return nil
	}, processor.Options{
		PollInterval: time.Hour, WorkSignal: silent(), Vacuum: processor.VacuumPolicy{Disabled: true},
		RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
	})
	waitFor(t, statusIs(b.mem, res.IDs[0], leasing.StatusDeadLettered), "the head dead-lettered")
	waitFor(t, statusIs(b.mem, res.IDs[1], leasing.StatusCompleted), "its successor handled without waiting for the poll")
}
