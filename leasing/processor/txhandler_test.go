package processor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/metrictest"
	"github.com/leasestore/leasestore/internal/spantest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// txBundle is an inbox on a fresh database with an effects table that
// TxHandlers write to: one row per applied effect, no unique constraint,
// so that a duplicate effect is counted, not refused.
type txBundle struct {
	url   string
	pool  *pgxpool.Pool
	inbox *leasing.Postgres
	meter *metrictest.Provider
}

func setupTx(t *testing.T) *txBundle {
	t.Helper()
	url := dbtest.DatabaseURL(t)
	pool := dbtest.OpenPool(t, url, "", 6)
	_, err := pool.Exec(t.Context(), `CREATE TABLE effects (message_id uuid NOT NULL, attempt int NOT NULL)`)
	require.NoError(t, err)
	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	return &txBundle{url: url, pool: pool, inbox: inbox, meter: metrictest.NewProvider()}
}

// effect is a TxHandler's write: one effects row for lease.
func effect(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, attempt) VALUES ($1, $2)`, lease.Message.ID, lease.Attempt)
	return err
}

// effects returns the attempts whose effect on id committed.
func (b *txBundle) effects(t *testing.T, id uuid.UUID) []int {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), `SELECT attempt FROM effects WHERE message_id = $1 ORDER BY attempt`, id)
	require.NoError(t, err)
	attempts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return attempts
}

func (b *txBundle) enqueue(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "payment.captured", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	res, err := b.inbox.Enqueue(t.Context(), msgs...)
	require.NoError(t, err)
	return res.IDs
}

// run starts a NewTx processor on the bundle's inbox, stopped when the
// test ends.
func (b *txBundle) run(t *testing.T, h processor.TxHandler, opts processor.Options) {
	t.Helper()
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	opts.Meter = b.meter.Meter("test")
	p, err := processor.NewTx(b.inbox, h, opts)
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
		require.NoError(t, <-ran)
	})
}

func TestTxHandler(t *testing.T) {
	t.Parallel()
	t.Run("effect and completion commit together", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		ids := b.enqueue(t, 5)
		b.run(t, effect, processor.Options{Concurrency: 2})
		for _, id := range ids {
			waitFor(t, statusIs(b.inbox, id, leasing.StatusCompleted), "completed")
		}
		for _, id := range ids {
			require.Equal(t, []int{1}, b.effects(t, id), "one effect per message")
			row, err := b.inbox.Get(t.Context(), id)
			require.NoError(t, err)
			require.Len(t, row.Attempts, 1, "one completion in the history")
			require.Equal(t, "completed", string(row.Attempts[0].End))
		}
		// The completions committed with the effects: counted, and no
		// outcome write follows them.
		waitFor(t, func() bool {
			return b.meter.Sum(processor.MetricName(leasing.Inbox, "processor.succeeded")) == int64(len(ids))
		},
			"every completion counted")
		require.Empty(t, b.meter.Records(processor.MetricName(leasing.Inbox, "processor.write_duration")), "an outcome write after the commit")
	})

	t.Run("a committed completion ends its process span without a write span", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		ids := b.enqueue(t, 3)
		tp := spantest.NewProvider()
		b.run(t, effect, processor.Options{Concurrency: 2, TracerProvider: tp})
		waitFor(t, func() bool { return len(tp.Named("process inbox")) == len(ids) }, "every process span ended")
		for _, s := range tp.Named("process inbox") {
			require.Equal(t, "succeeded", s.Attributes["messaging.leasestore.process.result"].AsString())
			require.Equal(t, string(leasing.OutcomeApplied), s.Attributes["messaging.leasestore.write.outcome"].AsString())
			require.Equal(t, codes.Unset, s.Status)
		}
		require.Empty(t, tp.Named("complete inbox"), "no outcome write follows a commit")
	})

	t.Run("an error, a panic or a timeout rolls the effect back", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		id := b.enqueue(t, 1)[0]
		h := func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
			if err := effect(ctx, tx, lease); err != nil {
				return err
			}
			switch lease.Attempt {
			case 1:
				if err := tx.Commit(ctx); !errors.Is(err, processor.ErrTxHandlerEndedTx) {
					return fmt.Errorf("the handler committed: %v", err)
				}
				return errors.New("ledger refused")
			case 2:
				panic("ledger exploded")
			case 3:
				<-ctx.Done() // past HandlerTimeout
				return nil
			}
			return nil
		}
		b.run(t, h, processor.Options{
			// Attempt 4's insert and commit must beat it; only attempt 3
			// waits it out.
			HandlerTimeout: time.Second,
			RetryPolicy:    processor.RetryPolicy{InitialDelay: time.Millisecond, MaxAttempts: 5},
		})
		waitFor(t, statusIs(b.inbox, id, leasing.StatusCompleted), "completed on attempt 4")
		require.Equal(t, []int{4}, b.effects(t, id), "only the attempt that returned nil committed its effect")
		row, err := b.inbox.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, 4, row.AttemptCount)
	})

	t.Run("a verdict counts as for a Handler", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		id := b.enqueue(t, 1)[0]
		b.run(t, func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
			if err := effect(ctx, tx, lease); err != nil {
				return err
			}
			return processor.Permanent(errors.New("unknown account"))
		}, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 5}})
		waitFor(t, statusIs(b.inbox, id, leasing.StatusDeadLettered), "dead-lettered at the first attempt")
		require.Empty(t, b.effects(t, id), "rolled back")
		row, err := b.inbox.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, 1, row.AttemptCount)
	})

	t.Run("a renew that the commit answers does not count the message lost", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		delay := &commitDelay{delay: 300 * time.Millisecond}
		cfg, err := pgxpool.ParseConfig(b.url)
		require.NoError(t, err)
		cfg.MaxConns = 4
		cfg.ConnConfig.Tracer = delay
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		b.inbox, err = leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		id := b.enqueue(t, 1)[0]
		tp := spantest.NewProvider()
		h := func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
			delay.conn.Store(tx.Conn())
			// The row's lock, held past several heartbeats: a renew waits
			// for it, and the commit answers that renew "lost".
			if _, err := tx.Exec(ctx, `SELECT FROM inbox_messages WHERE message_id = $1 FOR UPDATE`, lease.Message.ID); err != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond)
			return effect(ctx, tx, lease)
		}
		b.run(t, h, processor.Options{
			Concurrency: 1, LeaseDuration: 10 * time.Second, HeartbeatInterval: 20 * time.Millisecond, TracerProvider: tp,
		})
		waitFor(t, func() bool { return len(tp.Named("process inbox")) == 1 }, "the process span ended")
		span := tp.Named("process inbox")[0]
		require.Equal(t, "succeeded", span.Attributes["messaging.leasestore.process.result"].AsString())
		require.Equal(t, []int{1}, b.effects(t, id))
		require.Equal(t, int64(1), b.meter.Sum(processor.MetricName(leasing.Inbox, "processor.succeeded")))
		require.Zero(t, b.meter.Sum(processor.MetricName(leasing.Inbox, "processor.lease_lost")), "the committed message counted lost")
		require.Zero(t, b.meter.Sum(processor.MetricName(leasing.Inbox, "processor.persist_skipped")))
	})

	t.Run("HandlerTimeout interrupts a commit that stalls", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		admin := dbtest.AdminConn(t, b.url)
		// A deferred trigger makes each commit that inserted an effect
		// wait for an advisory lock that the test holds.
		_, err := admin.Exec(t.Context(), `
			CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
			CREATE CONSTRAINT TRIGGER effects_wait AFTER INSERT ON effects
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wait_for_test();
			SELECT pg_advisory_lock(4242)`)
		require.NoError(t, err)
		id := b.enqueue(t, 1)[0]
		b.run(t, effect, processor.Options{
			HandlerTimeout: 300 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
		})
		t.Cleanup(func() { // before the processor stops
			_, err := admin.Exec(context.Background(), `SELECT pg_advisory_unlock(4242)`)
			require.NoError(t, err)
		})
		waitFor(t, statusIs(b.inbox, id, leasing.StatusDeadLettered), "dead-lettered by the timeout while its commit waited")
		require.Empty(t, b.effects(t, id), "the interrupted commit rolled back")
	})

	t.Run("a lease lost before the commit rolls the effect back", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t)
		id := b.enqueue(t, 1)[0]
		admin := dbtest.AdminConn(t, b.url)
		stolen := make(chan leasing.Lease, 1)
		var calls atomic.Int32
		h := func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
			if err := effect(ctx, tx, lease); err != nil {
				return err
			}
			if calls.Add(1) > 1 {
				return nil
			}
			// Another worker takes the message over: the lease expires
			// and is claimed again under a new generation.
			_, err := admin.Exec(ctx, `UPDATE inbox_messages SET lease_expires_at = now() - interval '1 second' WHERE message_id = $1`, id)
			if err != nil {
				return err
			}
			leases, err := b.inbox.Claim(ctx, leasing.ClaimRequest{Owner: "thief", BatchSize: 1, LeaseFor: time.Minute})
			if err != nil || len(leases) != 1 {
				return fmt.Errorf("take the lease over: %d leases, %w", len(leases), err)
			}
			stolen <- leases[0]
			return nil // returns as if all went well: the fence must refuse the completion
		}
		// One slot, and no poll while the handler runs: the thief, not
		// this processor, claims the expired lease.
		b.run(t, h, processor.Options{
			Concurrency: 1, BatchSize: 1, PollInterval: time.Minute, HeartbeatInterval: time.Hour, LeaseDuration: 2 * time.Hour,
		})
		thief := receive(t, stolen, "the lease was taken over")
		waitFor(t, func() bool {
			return b.meter.Sum(processor.MetricName(leasing.Inbox, "processor.persist_rejected")) == 1
		}, "the lost attempt's failure was sent, and the fence refused it")
		require.Empty(t, b.effects(t, id), "the effect of the lost lease rolled back")
		row, err := b.inbox.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusProcessing, row.Status, "the thief still holds it")
		require.Equal(t, thief.Generation, row.LeaseGeneration)
		res, err := b.inbox.Complete(t.Context(), thief)
		require.NoError(t, err)
		require.NoError(t, res.Err())
	})
}

// commitDelay delays the return of COMMIT on one connection, after the
// server has committed: what a renew blocked on the committed rows hears
// then reaches the processor before the handler returns.
type commitDelay struct {
	conn  atomic.Pointer[pgx.Conn]
	delay time.Duration
}

// commitDelayed marks the context of a COMMIT that commitDelay delays.
type commitDelayed struct{}

func (d *commitDelay) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if conn == d.conn.Load() && strings.EqualFold(data.SQL, "commit") {
		return context.WithValue(ctx, commitDelayed{}, true)
	}
	return ctx
}

func (d *commitDelay) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(commitDelayed{}) != nil {
		time.Sleep(d.delay)
	}
}

func TestNewTxArguments(t *testing.T) {
	t.Parallel()
	h := func(context.Context, pgx.Tx, leasing.Lease) error { return nil }
	_, err := processor.NewTx(nil, h, processor.Options{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument, "PostgreSQL only: a nil store")
	require.ErrorContains(t, err, "*leasing.Postgres")

	url := dbtest.DatabaseURL(t)
	inbox, err := leasing.NewPostgres(dbtest.OpenPool(t, url, "", 4), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	_, err = processor.NewTx(inbox, nil, processor.Options{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	_, err = processor.NewTx(inbox, h, processor.Options{Concurrency: 4})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument, "every connection held by a handler: none left to renew")
	require.ErrorContains(t, err, "MaxConns of at least 5")
	p, err := processor.NewTx(inbox, h, processor.Options{Concurrency: 3})
	require.NoError(t, err)
	require.Equal(t, 3, p.Options().Concurrency)

	small, err := leasing.NewPostgres(dbtest.OpenPool(t, url, "", 3), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	p, err = processor.NewTx(small, h, processor.Options{})
	require.NoError(t, err)
	require.Equal(t, 2, p.Options().Concurrency, "left 0, Concurrency leaves the heartbeat a connection")
}
