package processor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestListenerWakesProcessor runs a processor whose poll interval (1h) never
// ends during the test, with a Listener as its work signal, so that every
// claim after its first one follows a wake. A new message is handled soon
// after its insert's NOTIFY. Then the listener's backend is terminated five
// times: each time the listener reconnects on a new backend (and wakes once,
// as rows may have come in meanwhile), and the next insert's NOTIFY wakes
// the processor again.
func TestListenerWakesProcessor(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := e2eSetup(t, q)
			cfg, err := pgx.ParseConfig(b.url)
			require.NoError(t, err)
			var listenErrors atomic.Int32
			l, err := leasing.NewListener(cfg, q, leasing.ListenerOptions{
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
				OnError: func(error) { listenErrors.Add(1) },
			})
			require.NoError(t, err)
			require.Equal(t, string(q)+"_messages", l.Channel())

			p := b.start(t, "a", e2eOK, processor.Options{PollInterval: time.Hour, WorkSignal: l})
			b.waitFor(t, p.claimsMark()(1), "the claim at start")
			claims := p.claimsMark()

			// The listener starts after that first claim: the wake it sends
			// once LISTEN is in place makes the second claim.
			listenCtx, stopListening := context.WithCancel(ctx)
			listened := make(chan error, 1)
			go func() { listened <- l.Run(listenCtx) }()
			t.Cleanup(func() {
				stopListening()
				require.NoError(t, <-listened)
				require.Zero(t, l.BackendPID(), "no LISTEN after Run returns")
			})
			b.waitFor(t, claims(1), "the claim after the listener's first wake")
			pid := l.BackendPID()
			require.NotZero(t, pid)

			// handled enqueues one message once the processor is idle
			// (claims made so far: want) and waits until it is handled,
			// which takes one more claim, so one more wake.
			handled := func(want int64, what string) {
				t.Helper()
				b.waitFor(t, claims(want), "claim %d (%s)", want, what)
				start := time.Now()
				id := b.enqueueN(t, 1)[0]
				b.waitStatus(t, id, q.Succeeded())
				t.Logf("%s: handled %s after the insert (%s)", q, time.Since(start).Round(time.Millisecond), what)
			}
			handled(1, "first NOTIFY")
			want := int64(2)

			for i := range 5 {
				var terminated bool
				require.NoError(t, b.store.Pool().QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&terminated))
				require.True(t, terminated)
				b.waitFor(t, func() bool { n := l.BackendPID(); return n != 0 && n != pid }, "listener back on a new backend after break %d", i+1)
				pid = l.BackendPID()
				// One claim from the wake after the reconnect, then one
				// from the insert's NOTIFY.
				handled(want+1, "NOTIFY after a reconnect")
				want += 2
			}
			require.GreaterOrEqual(t, listenErrors.Load(), int32(5), "each break reaches OnError")
			require.NoError(t, p.stop(t))
			p.requireCounters(t, map[string]int64{"leases_acquired": 6, "succeeded": 6})
		})
	}
}

// TestListenerNotifyOncePerStatement listens on each queue's channel with
// its own connection and counts the payload-less notifications that arrive
// before a sentinel NOTIFY (payload "end") sent after the inserts: since
// notifications arrive in commit order, every notification of the inserts
// precedes the sentinel. The signal is rate-limited (migration 00009, ten
// milliseconds per notification, bursts of five): the inserts below are
// spaced to stay within its budget; TestWorkSignalRateLimited covers
// inserts beyond it.
//
// PostgreSQL also folds identical notifications within one transaction into
// one, so a count of one per 500-row statement holds for a per-row trigger
// too; the catalog check that the trigger is FOR EACH STATEMENT is what
// rules out the per-row notifies that serialise bulk enqueues.
func TestListenerNotifyOncePerStatement(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := e2eSetup(t, q)
			conn, err := pgx.Connect(ctx, b.url)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			channel := q.Channel()
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
			require.NoError(t, err)

			// count sends the sentinel and returns the payload-less
			// notifications received before it.
			count := func() int {
				t.Helper()
				_, err := b.store.Pool().Exec(ctx, "SELECT pg_notify($1, 'end')", channel)
				require.NoError(t, err)
				wctx, cancel := context.WithTimeout(ctx, e2eWait)
				defer cancel()
				n := 0
				for {
					note, err := conn.WaitForNotification(wctx)
					require.NoError(t, err, "the sentinel never arrived")
					require.Equal(t, channel, note.Channel)
					if note.Payload == "end" {
						return n
					}
					require.Empty(t, note.Payload, "the work signal carries no payload")
					n++
				}
			}
			require.Zero(t, count(), "nothing notifies before any insert")
			// newSlot waits long enough for the signal's budget to allow
			// one more notification (10 ms each).
			newSlot := func() { time.Sleep(15 * time.Millisecond) }

			newSlot()
			b.enqueueN(t, 500) // one INSERT statement
			require.Equal(t, 1, count(), "one notification for a 500-row statement")

			newSlot()
			b.enqueueN(t, 3)
			newSlot()
			b.enqueueN(t, 3)
			require.Equal(t, 2, count(), "two statements in two transactions, within the budget: two notifications")

			msgs := make([]leasing.NewMessage, 500)
			for i := range msgs {
				if q == leasing.Outbox {
					msgs[i].Topic = e2eTopic
				}
			}
			newSlot()
			err = pgx.BeginFunc(ctx, b.store.Pool(), func(tx pgx.Tx) error { _, err := b.store.EnqueueCopy(ctx, tx, msgs...); return err })
			require.NoError(t, err)
			require.Equal(t, 1, count(), "one notification for a 500-row COPY")

			var perStatement int
			require.NoError(t, b.store.Pool().QueryRow(ctx, `
				SELECT count(*) FROM pg_trigger
				WHERE tgrelid = $1::regclass AND NOT tgisinternal
				  AND tgfoid = 'leasestore_signal_work'::regproc
				  AND tgtype & 1 = 0 -- TRIGGER_TYPE_ROW unset: FOR EACH STATEMENT
				  AND tgtype & 4 <> 0 -- TRIGGER_TYPE_INSERT`, channel).Scan(&perStatement))
			require.Equal(t, 1, perStatement, "the %s work-signal trigger is a statement trigger on insert", channel)
			var perRow int
			require.NoError(t, b.store.Pool().QueryRow(ctx, `
				SELECT count(*) FROM pg_trigger
				WHERE tgrelid = $1::regclass AND NOT tgisinternal AND tgtype & 1 <> 0`, channel).Scan(&perRow))
			require.Zero(t, perRow, "no row trigger on %s", channel)
		})
	}
}
