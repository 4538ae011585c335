package reliability_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// Faults at the store level (deterministic) and at the processor level.
//
// This file holds the fault injection helpers; each fault scenario has a
// file of its own: unknown commits (fault_unknown_commit_test.go), paused
// workers and processors (fault_pause_test.go), the work signal
// (fault_listener_test.go), chaos runs and a server restart
// (fault_chaos_test.go), phantom claims (fault_phantom_claim_test.go) and
// writes racing a committed change (fault_write_race_test.go).

// dropAfterCommit is a dialer whose connections, once armed, let the next
// statement through and then die before its reply is read.
type dropAfterCommit struct {
	mu      sync.Mutex
	trigger []byte // arm on a write that holds these bytes (a message id as sent: its text form)
	wait    func() // blocks until the statement's effect is visible
	fired   atomic.Int32
}

func (d *dropAfterCommit) arm(trigger []byte, wait func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.trigger, d.wait = trigger, wait
}

func (d *dropAfterCommit) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropAfterCommitConn{Conn: c, d: d}, nil
}

type dropAfterCommitConn struct {
	net.Conn
	d    *dropAfterCommit
	wait func() // set by the write that holds the trigger; under d.mu
}

// Write arms the connection before it writes a trigger: pgx may already be
// reading on another goroutine (pgconn starts a background reader when a
// write takes over 15 ms), and that read must not hand the reply over.
func (c *dropAfterCommitConn) Write(b []byte) (int, error) {
	c.d.mu.Lock()
	if c.d.trigger != nil && bytes.Contains(b, c.d.trigger) {
		c.wait, c.d.trigger = c.d.wait, nil
	}
	c.d.mu.Unlock()
	return c.Conn.Write(b)
}

// Read drops the connection instead of returning the reply to an armed
// write, also when the read began before the write.
func (c *dropAfterCommitConn) Read(b []byte) (int, error) {
	if c.drop() {
		return 0, errReplyLost
	}
	n, err := c.Conn.Read(b)
	if c.drop() {
		return 0, errReplyLost
	}
	return n, err
}

var errReplyLost = errors.New("fault: connection lost before the reply")

// drop reports whether the connection was armed; if so it waits for the
// write's effect to be visible, then closes the socket.
func (c *dropAfterCommitConn) drop() bool {
	c.d.mu.Lock()
	wait := c.wait
	c.wait = nil
	c.d.mu.Unlock()
	if wait == nil {
		return false
	}
	wait()
	c.d.fired.Add(1)
	_ = c.Conn.Close()
	return true
}

// rowState reads what the fence and the outcome classification look at.
func rowState(tb testing.TB, admin *pgx.Conn, q leasing.Queue, id uuid.UUID) (status string, gen int64) {
	tb.Helper()
	err := admin.QueryRow(context.Background(), "SELECT status, lease_generation FROM "+tableOf(q)+" WHERE message_id = $1", id).Scan(&status, &gen)
	require.NoError(tb, err)
	return status, gen
}

// faultWrite is one fenced write of a lease, with the status it leaves.
type faultWrite struct {
	name   string
	status func(q leasing.Queue) string
	do     func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error)
}

// faultWrites are the four outcome writes.
var faultWrites = []faultWrite{
	{"Complete", func(q leasing.Queue) string { return string(q.Succeeded()) },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Complete(ctx, l)
		}},
	{"Fail", func(leasing.Queue) string { return "failed" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Fail(ctx, leasing.Failure{Lease: l, RetryAfter: time.Hour, Error: "boom"})
		}},
	{"DeadLetter", func(leasing.Queue) string { return "dead_lettered" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.DeadLetter(ctx, leasing.Failure{Lease: l, Error: "poison"})
		}},
	{"Release", func(leasing.Queue) string { return "pending" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Release(ctx, l)
		}},
}
