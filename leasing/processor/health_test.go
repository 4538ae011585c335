package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// recordLog is a slog.Handler that keeps every record's level and message.
type recordLog struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordLog) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level have a message containing msg.
func (l *recordLog) count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// checkCounter is a Postgres store that counts its privilege checks.
type checkCounter struct {
	*leasing.Postgres
	checks atomic.Int32
}

func (s *checkCounter) CheckPrivileges(ctx context.Context) error {
	defer s.checks.Add(1)
	return s.Postgres.CheckPrivileges(ctx)
}

// hideLastMigration makes the database's history lack its newest
// migration (hide) or have it again (!hide).
func hideLastMigration(t *testing.T, pool *pgxpool.Pool, hide bool) {
	t.Helper()
	sql := "UPDATE leasestore_db_version SET version_id = -version_id WHERE version_id = (SELECT max(version_id) FROM leasestore_db_version)"
	if !hide {
		sql = "UPDATE leasestore_db_version SET version_id = -version_id WHERE version_id = (SELECT min(version_id) FROM leasestore_db_version)"
	}
	_, err := pool.Exec(t.Context(), sql)
	require.NoError(t, err)
}

// probe returns the status code and body of a GET of path on h.
func probe(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return rec.Code, body
}

// TestHealthSchemaBehind: on a database that lacks a migration the
// processor reports StateSchemaBehind with the *leasing.SchemaError, is
// not ready, logs it once at error however often it checks, and starts
// claiming once the migration is there; with FailOnSchemaBehind Run
// returns the *leasing.SchemaError.
func TestHealthSchemaBehind(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	hideLastMigration(t, pool, true)
	pg, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	t.Run("FailFast", func(t *testing.T) {
		p, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil },
			processor.Options{PollInterval: 10 * time.Millisecond, FailOnSchemaBehind: true})
		require.NoError(t, err)
		runErr := p.Run(t.Context())
		var se *leasing.SchemaError
		require.ErrorAs(t, runErr, &se)
		require.NotEmpty(t, se.Migrations)
		h := p.Health()
		require.Equal(t, processor.StateStopped, h.State)
		require.False(t, h.Live)
		require.Contains(t, h.Reason, "schema is behind")
	})

	t.Run("WaitsForTheMigration", func(t *testing.T) {
		store := &checkCounter{Postgres: pg}
		logs := &recordLog{}
		handled := make(chan struct{}, 1)
		p, err := processor.New(store, func(context.Context, leasing.Lease) error { handled <- struct{}{}; return nil },
			processor.Options{PollInterval: 10 * time.Millisecond, Logger: slog.New(logs)})
		require.NoError(t, err)
		hh := processor.HealthHandler(p)
		code, _ := probe(t, hh, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, "not ready before Run")
		code, _ = probe(t, hh, "/livez")
		require.Equal(t, http.StatusOK, code)

		errc := make(chan error, 1)
		go func() { errc <- p.Run(context.Background()) }()
		defer func() {
			require.NoError(t, p.Stop(context.Background()))
			require.NoError(t, <-errc)
		}()
		require.Eventually(t, func() bool { return store.checks.Load() >= 5 }, 10*time.Second, 5*time.Millisecond)
		h := p.Health()
		require.Equal(t, processor.StateSchemaBehind, h.State)
		var se *leasing.SchemaError
		require.ErrorAs(t, h.Err, &se)
		require.False(t, h.Ready)
		require.True(t, h.Live)
		require.Equal(t, 1, logs.count(slog.LevelError, "schema is behind"), "logged once, not at every check")
		require.Zero(t, logs.count(slog.LevelWarn, "privilege check failed"))
		code, body := probe(t, hh, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "unavailable", body["status"])
		require.Equal(t, "schema_behind", body["processors"].([]any)[0].(map[string]any)["state"])

		hideLastMigration(t, pool, false)
		_, err = pg.Enqueue(t.Context(), leasing.NewMessage{Type: "t", Payload: []byte("x")})
		require.NoError(t, err)
		select {
		case <-handled:
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no message handled after the migration")
		}
		h = p.Health()
		require.Equal(t, processor.StateRunning, h.State)
		require.True(t, h.Ready)
		require.NoError(t, h.Err)
		require.False(t, h.LastClaim.IsZero())
		require.Eventually(t, func() bool { return !p.Health().LastWrite.IsZero() }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, 1, logs.count(slog.LevelInfo, "schema is ready"))
		code, _ = probe(t, hh, "/readyz")
		require.Equal(t, http.StatusOK, code)
	})
}

// TestHealthHandler: the handler's status codes follow the processors'
// states, one unready processor makes the whole answer 503, and other
// paths and methods are refused.
func TestHealthHandler(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	running, err := processor.New(b.mem, func(context.Context, leasing.Lease) error { return nil },
		processor.Options{PollInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	idle, err := processor.New(b.mem, func(context.Context, leasing.Lease) error { return nil }, processor.Options{})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- running.Run(context.Background()) }()
	require.Eventually(t, func() bool { return running.Health().Ready }, 10*time.Second, time.Millisecond)

	code, _ := probe(t, processor.HealthHandler(running), "/readyz")
	require.Equal(t, http.StatusOK, code)
	code, body := probe(t, processor.HealthHandler(running, idle), "/health/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Len(t, body["processors"], 2)
	code, _ = probe(t, processor.HealthHandler(running, idle), "/livez")
	require.Equal(t, http.StatusOK, code)

	rec := httptest.NewRecorder()
	processor.HealthHandler(running).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/other", nil))
	require.Equal(t, http.StatusNotFound, rec.Code)
	rec = httptest.NewRecorder()
	processor.HealthHandler(running).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/livez", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)

	require.NoError(t, running.Stop(context.Background()))
	require.NoError(t, <-errc)
	require.Equal(t, processor.StateStopped, running.Health().State)
	code, _ = probe(t, processor.HealthHandler(running), "/livez")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// TestHealthPrivilegesRefused: a processor refused a privilege, by the
// check before its first claim or by an outcome write, ends in
// StatePrivilegesRefused, not live, with the refusal as its reason.
func TestHealthPrivilegesRefused(t *testing.T) {
	t.Parallel()
	denied := fmt.Errorf("%w: permission denied for table inbox_ordering_keys", leasing.ErrPermissionDenied)
	for name, store := range map[string]func(*processorBundle) processor.Store{
		"Check": func(b *processorBundle) processor.Store {
			return &privilegeStore{storeHooks: storeHooks{Store: b.mem}, check: &leasing.PrivilegeError{
				Queue: leasing.Inbox, User: "app", Refused: []leasing.RefusedCall{{Call: "complete", Err: denied}}}}
		},
		"Write": func(b *processorBundle) processor.Store {
			s := &privilegeStore{storeHooks: storeHooks{Store: b.mem}}
			s.complete = func(context.Context, ...leasing.Lease) (leasing.WriteResult, error) {
				return leasing.WriteResult{}, denied
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, leasing.Inbox)
			b.enqueue(t, 1)
			p, err := processor.New(store(b), func(context.Context, leasing.Lease) error { return nil },
				processor.Options{PollInterval: 5 * time.Millisecond})
			require.NoError(t, err)
			require.ErrorIs(t, p.Run(context.Background()), leasing.ErrPermissionDenied)
			h := p.Health()
			require.Equal(t, processor.StatePrivilegesRefused, h.State)
			require.False(t, h.Live)
			require.False(t, h.Ready)
			require.ErrorIs(t, h.Err, leasing.ErrPermissionDenied)
		})
	}
}
