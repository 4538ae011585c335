package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// vacuumRefused is a store whose role may not vacuum.
type vacuumRefused struct {
	*leasing.Memory
	calls atomic.Int32
}

func (s *vacuumRefused) VacuumIfDead(context.Context, int64) (leasing.Vacuum, error) {
	s.calls.Add(1)
	return leasing.Vacuum{}, fmt.Errorf("%w inbox_messages", leasing.ErrVacuumNotAllowed)
}

// TestVacuumNotAllowedSaidOnce: a processor whose role may not vacuum (a
// least-privilege role before PostgreSQL 17) says so once, at info, with
// what to do, and neither warns nor passes it to OnError.
func TestVacuumNotAllowedSaidOnce(t *testing.T) {
	t.Parallel()
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	store := &vacuumRefused{Memory: mem}
	logs := &recordLog{}
	var mu sync.Mutex
	var reported []error
	handled := make(chan struct{}, 10)
	p, err := processor.New(store, func(context.Context, leasing.Lease) error { handled <- struct{}{}; return nil }, processor.Options{
		PollInterval: 5 * time.Millisecond, Logger: slog.New(logs),
		Vacuum:  processor.VacuumPolicy{CheckInterval: time.Millisecond},
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
	})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	_, err = mem.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("x")})
	require.NoError(t, err)
	<-handled
	require.Eventually(t, func() bool { return store.calls.Load() > 0 }, 10*time.Second, time.Millisecond)
	_, err = mem.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("y")})
	require.NoError(t, err)
	<-handled
	require.NoError(t, p.Stop(context.Background()))
	require.NoError(t, <-errc)

	require.Equal(t, int32(1), store.calls.Load(), "the policy stops after the refusal")
	require.Equal(t, 1, logs.count(slog.LevelInfo, "may not VACUUM"))
	require.Contains(t, func() string {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range logs.records {
			if r.Level == slog.LevelInfo {
				return r.Message
			}
		}
		return ""
	}(), "db/roles.sql")
	require.Zero(t, logs.count(slog.LevelWarn, "VACUUM"))
	mu.Lock()
	defer mu.Unlock()
	for _, err := range reported {
		require.False(t, errors.Is(err, leasing.ErrVacuumNotAllowed), err)
	}
}
