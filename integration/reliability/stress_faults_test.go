package reliability_test

import (
	"context"
	"errors"
	mathrand "math/rand/v2"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// replyDropper makes connections die after a statement was sent and before
// its reply is read: the outcome of that statement is unknown to the
// client. Depending on timing the server has committed it or not. Which
// writes send such a statement is up to arms; newReplyDropper makes one.
type replyDropper struct {
	rate    float64
	arms    func(b []byte) bool // whether writing b sends a statement whose reply may be lost
	lost    string              // the error a lost reply reads as
	dropped atomic.Int64
}

// newReplyDropper loses, at rate, the reply to a statement for which arms
// holds; a lost reply reads as "fault: connection lost after <what> was
// sent".
func newReplyDropper(rate float64, arms func(b []byte) bool, what string) *replyDropper {
	return &replyDropper{rate: rate, arms: arms, lost: "fault: connection lost after " + what + " was sent"}
}

// startsStatement reports whether b, written to a server connection,
// starts a statement: 'B' (Bind) or 'Q' (simple query). Startup and
// authentication messages do not.
func startsStatement(b []byte) bool {
	return len(b) > 0 && (b[0] == 'B' || b[0] == 'Q')
}

func (d *replyDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

type droppingConn struct {
	net.Conn
	d     *replyDropper
	armed atomic.Bool
}

func (c *droppingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil && c.d.arms(b) && mathrand.Float64() < c.d.rate {
		c.armed.Store(true)
	}
	return n, err
}

func (c *droppingConn) Read(b []byte) (int, error) {
	if c.armed.Load() {
		time.Sleep(time.Duration(mathrand.IntN(3)) * time.Millisecond) // sometimes the server has committed
		c.d.dropped.Add(1)
		_ = c.Conn.Close()
		return 0, errors.New(c.d.lost)
	}
	return c.Conn.Read(b)
}

// isConnErr reports whether err means the connection or server went away.
func isConnErr(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	for _, frag := range []string{"terminating connection", "connection reset", "conn closed", "EOF", "broken pipe",
		"connection refused", "the database system is", "shutting down", "57P01", "57P02", "57P03", "failed to connect", "unexpected EOF"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}

// reconnect connects to url, retrying for up to a minute (a server restart).
func reconnect(ctx context.Context, url string) (*pgx.Conn, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// backendStart returns how long connecting to url takes, the median of
// five connections: mostly the server starting a backend.
func backendStart(t *testing.T, url string) time.Duration {
	t.Helper()
	took := make([]time.Duration, 5)
	for i := range took {
		began := time.Now()
		conn, err := pgx.Connect(t.Context(), url)
		require.NoError(t, err)
		took[i] = time.Since(began)
		require.NoError(t, conn.Close(t.Context()))
	}
	slices.Sort(took)
	return took[len(took)/2]
}

// restartServer restarts the local PostgreSQL 15 cluster and waits until it
// accepts connections again. Only the long form calls it: it breaks every
// session on the shared server.
func restartServer(t *testing.T) {
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart").CombinedOutput()
	if err != nil {
		t.Errorf("restart PostgreSQL: %v: %s", err, out)
	}
	ensureServerUp(t)
}

// ensureServerUp starts the cluster if it does not answer and waits until
// it does.
func ensureServerUp(t *testing.T) {
	ready := func() bool { return exec.Command("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432").Run() == nil }
	for range 120 {
		if ready() {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	_ = exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start").Run()
	for range 120 {
		if ready() {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("PostgreSQL did not come back after the restart")
}
