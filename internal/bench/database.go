package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// table describes one queue's table for the fill and verify statements.
// The names are fixed identifiers, never input.
type table struct {
	name     string // inbox_messages or outbox_messages
	inFlight string // processing or publishing
	success  string // completed or published
	doneAt   string // completed_at or published_at
	keys     string // inbox_ordering_keys or outbox_ordering_keys
	topic    string // message_type or topic: what ClaimRequest.Topics matches
}

func tableOf(q leasing.Queue) table {
	doneAt, topic := "completed_at", "message_type"
	if q == leasing.Outbox {
		doneAt, topic = "published_at", "topic"
	}
	return table{q.Table(), string(q.InFlight()), string(q.Succeeded()), doneAt, q.KeyTable(), topic}
}

// Row kinds, stored in message_type so that verification can tell them apart.
const (
	kindDue      = "bench"
	kindExpired  = "bench-expired"
	kindDeferred = "bench-deferred"
	kindTerminal = "bench-terminal"
	// kindTopic is the topic of the rows a topic-scoped claim takes
	// (Config.TopicRows), in the table's topic column.
	kindTopic = "bench-topic"
)

// fillSQL inserts $2 rows of one kind, numbered from $1 in created_at order
// (1 ms apart, starting 30 days ago). $3 is the kind, $4 the payload size in
// bytes. Terminal rows are finished, deferred rows are due in a day, expired
// rows hold a lease that ended a minute ago, due rows are pending and due.
const fillSQL = `
INSERT INTO %[1]s (message_id, message_type, payload, created_at, visible_after, status,
                   lease_owner, lease_expires_at, lease_generation, attempt_count,
                   last_attempted_at, %[4]s)
SELECT gen_random_uuid(), $3::text, p.payload, c.created_at,
       CASE $3::text WHEN 'bench-deferred' THEN now() + interval '1 day' ELSE c.created_at END,
       CASE $3::text WHEN 'bench-terminal' THEN '%[3]s'
                     WHEN 'bench-expired' THEN '%[2]s'
                     ELSE 'pending' END,
       CASE WHEN $3::text IN ('bench-terminal', 'bench-expired') THEN 'bench-history' END,
       CASE $3::text WHEN 'bench-expired' THEN now() - interval '1 minute' END,
       CASE WHEN $3::text IN ('bench-terminal', 'bench-expired') THEN 1 ELSE 0 END,
       CASE WHEN $3::text IN ('bench-terminal', 'bench-expired') THEN 1 ELSE 0 END,
       CASE WHEN $3::text IN ('bench-terminal', 'bench-expired') THEN c.created_at END,
       CASE $3::text WHEN 'bench-terminal' THEN c.created_at + interval '1 second' END
FROM (SELECT now() - interval '30 days' + g * interval '1 millisecond' AS created_at
      FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g) AS c,
     (SELECT convert_to(repeat('x', $4::integer), 'UTF8') AS payload) AS p`

// topicFillSQL inserts $2 due pending rows of topic $3 (the table's topic
// column, %[2]s), numbered from $1 as fillSQL's rows are, with payloads
// of $4 bytes.
const topicFillSQL = `
INSERT INTO %[1]s (message_id, %[2]s, payload, created_at, visible_after)
SELECT gen_random_uuid(), $3::text, p.payload, c.created_at, c.created_at
FROM (SELECT now() - interval '30 days' + g * interval '1 millisecond' AS created_at
      FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g) AS c,
     (SELECT convert_to(repeat('x', $4::integer), 'UTF8') AS payload) AS p`

// keyedFillSQL inserts $2 due rows numbered from $1, as fillSQL's due
// kind, over $5 ordering keys: row $1 + i has key key-(i mod $5) and
// key_seq i / $5 + 1, so that each key's line is in created_at order; the
// first row of each key is its head (pending), the rest wait. $6 is the
// number of the first due row.
const keyedFillSQL = `
INSERT INTO %[1]s (message_id, message_type, payload, created_at, visible_after, status, ordering_key, key_seq)
SELECT gen_random_uuid(), $3::text, p.payload, c.created_at, c.created_at,
       CASE WHEN c.i < $5::bigint THEN 'pending' ELSE 'waiting' END,
       'key-' || (c.i %% $5::bigint), c.i / $5::bigint + 1
FROM (SELECT now() - interval '30 days' + g * interval '1 millisecond' AS created_at, g - $6::bigint AS i
      FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g) AS c,
     (SELECT convert_to(repeat('x', $4::integer), 'UTF8') AS payload) AS p`

// keyRowsSQL writes the key rows of a keyed fill: one per key, its head
// the pending row, last_seq its highest key_seq.
const keyRowsSQL = `
INSERT INTO %[2]s (tenant_id, ordering_key, last_seq, head_id, head_since)
SELECT '', ordering_key, max(key_seq), (array_agg(message_id ORDER BY key_seq))[1], now()
FROM %[1]s
WHERE ordering_key IS NOT NULL
GROUP BY ordering_key`

// outOfOrderSQL counts the rows that completed before the row ahead of
// them in their key's line: 0 after a keyed drain that kept order.
const outOfOrderSQL = `
SELECT count(*)::bigint FROM (
    SELECT %[2]s < lag(%[2]s) OVER (PARTITION BY ordering_key ORDER BY key_seq) AS early
    FROM %[1]s
    WHERE ordering_key IS NOT NULL
) AS s
WHERE early`

// verifySQL counts, over the rows a drain must finish (due and expired
// kinds), how many reached the success state and how many claims they took
// (lease_generation beyond what the fill gave them), and how many rows of
// the other kinds a drain changed.
const verifySQL = `
SELECT count(*) FILTER (WHERE message_type IN ('bench', 'bench-expired'))::bigint,
       count(*) FILTER (WHERE message_type IN ('bench', 'bench-expired') AND status = '%[2]s')::bigint,
       coalesce(sum(lease_generation - CASE message_type WHEN 'bench-expired' THEN 1 ELSE 0 END)
                FILTER (WHERE message_type IN ('bench', 'bench-expired')), 0)::bigint,
       count(*) FILTER (WHERE message_type = 'bench-deferred' AND (status <> 'pending' OR lease_generation <> 0))::bigint
         + count(*) FILTER (WHERE message_type = 'bench-terminal' AND (status <> '%[2]s' OR lease_generation <> 1))::bigint
FROM %[1]s`

// createDatabase creates a database named leasestore_bench_<random> on the
// server of adminURL and returns its name and URL.
func createDatabase(ctx context.Context, adminURL string) (name, dbURL string, err error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = "leasestore_bench_" + hex.EncodeToString(b)
	dbURL, err = pgadmin.CreateDatabase(ctx, adminURL, name, "")
	if err != nil {
		return "", "", fmt.Errorf("bench: create database: %w", err)
	}
	return name, dbURL, nil
}

// dropDatabase drops database name, disconnecting any session left on it.
func dropDatabase(adminURL, name string) error {
	return pgadmin.DropDatabase(adminURL, name)
}

// runDatabase creates the database of one bench run (createDatabase) and
// returns with it the function the run defers: it drops the database
// unless cfg.Keep, and sets *err to the drop's error when *err is nil.
func runDatabase(ctx context.Context, cfg Config) (name, dbURL string, drop func(err *error), err error) {
	name, dbURL, err = createDatabase(ctx, cfg.AdminURL)
	if err != nil {
		return "", "", nil, err
	}
	return name, dbURL, func(err *error) {
		if cfg.Keep {
			return
		}
		if dropErr := dropDatabase(cfg.AdminURL, name); dropErr != nil && *err == nil {
			*err = fmt.Errorf("bench: drop database %s: %w", name, dropErr)
		}
	}, nil
}

// fill loads the backlog shape of cfg into t, oldest first: terminal rows,
// deferred rows (the FIFO head, not yet due), expired leases, due rows; then
// VACUUM (ANALYZE), so that the drain starts from a table in service state,
// and a CHECKPOINT, so that each drain starts with no checkpoint due: a
// drain of 200k rows writes about 250 MB of WAL, and without it the
// checkpoint that WAL volume requests fell inside one drain of a pair and
// not the other. A role that may not CHECKPOINT (neither superuser nor
// pg_checkpoint) skips it.
//
// With keys > 0 the due rows have ordering keys (keyedFillSQL) and their
// key rows are written after them.
func fill(ctx context.Context, pool *pgxpool.Pool, t table, cfg Config, keys int) error {
	stmt := fmt.Sprintf(fillSQL, pgx.Identifier{t.name}.Sanitize(), t.inFlight, t.success, pgx.Identifier{t.doneAt}.Sanitize())
	keyed := fmt.Sprintf(keyedFillSQL, pgx.Identifier{t.name}.Sanitize())
	var next, dueStart int64
	for _, part := range []struct {
		kind string
		rows int
	}{
		{kindTerminal, cfg.TerminalRows},
		{kindDeferred, cfg.DeferredRows},
		{kindExpired, cfg.ExpiredLeases},
		{kindDue, cfg.Messages},
	} {
		if part.kind == kindDue {
			dueStart = next
		}
		// Chunks of 250k rows keep each statement's memory and WAL modest.
		for done := 0; done < part.rows; {
			n := min(part.rows-done, 250_000)
			var err error
			if part.kind == kindDue && keys > 0 {
				_, err = pool.Exec(ctx, keyed, next, n, part.kind, cfg.PayloadBytes, keys, dueStart)
			} else {
				_, err = pool.Exec(ctx, stmt, next, n, part.kind, cfg.PayloadBytes)
			}
			if err != nil {
				return fmt.Errorf("bench: fill %s rows: %w", part.kind, err)
			}
			done += n
			next += int64(n)
		}
	}
	if keys > 0 {
		if _, err := pool.Exec(ctx, fmt.Sprintf(keyRowsSQL, pgx.Identifier{t.name}.Sanitize(), pgx.Identifier{t.keys}.Sanitize())); err != nil {
			return fmt.Errorf("bench: fill key rows: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+pgx.Identifier{t.name}.Sanitize()); err != nil {
		return fmt.Errorf("bench: vacuum: %w", err)
	}
	var pgErr *pgconn.PgError
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42501") {
		return fmt.Errorf("bench: checkpoint: %w", err)
	}
	return nil
}

// fillTopic adds cfg.TopicRows due rows of topic kindTopic behind every
// row fill inserted (so that all of fill's due rows, of other topics, are
// ahead of them), then vacuums and analyzes t.
func fillTopic(ctx context.Context, pool *pgxpool.Pool, t table, cfg Config) error {
	next := int64(cfg.TerminalRows + cfg.DeferredRows + cfg.ExpiredLeases + cfg.Messages)
	stmt := fmt.Sprintf(topicFillSQL, pgx.Identifier{t.name}.Sanitize(), pgx.Identifier{t.topic}.Sanitize())
	if _, err := pool.Exec(ctx, stmt, next, cfg.TopicRows, kindTopic, cfg.PayloadBytes); err != nil {
		return fmt.Errorf("bench: fill topic rows: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+pgx.Identifier{t.name}.Sanitize()); err != nil {
		return fmt.Errorf("bench: vacuum: %w", err)
	}
	return nil
}

// truncate empties t and its ordering keys for the next run.
func truncate(ctx context.Context, pool *pgxpool.Pool, t table) error {
	_, err := pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{t.name}.Sanitize()+", "+pgx.Identifier{t.keys}.Sanitize())
	return err
}

// outOfOrder returns how many keyed rows of t completed before the row
// ahead of them in their key's line.
func outOfOrder(ctx context.Context, pool *pgxpool.Pool, t table) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, fmt.Sprintf(outOfOrderSQL, pgx.Identifier{t.name}.Sanitize(), pgx.Identifier{t.doneAt}.Sanitize())).Scan(&n)
	return n, err
}

// verification is what verifySQL found.
type verification struct {
	expected, succeeded, claims, otherChanged int64
}

func verify(ctx context.Context, pool *pgxpool.Pool, t table) (verification, error) {
	var v verification
	stmt := fmt.Sprintf(verifySQL, pgx.Identifier{t.name}.Sanitize(), t.success)
	err := pool.QueryRow(ctx, stmt).Scan(&v.expected, &v.succeeded, &v.claims, &v.otherChanged)
	return v, err
}

// problem returns why v fails a drain that should have finished want rows,
// or "" when it passes.
func (v verification) problem(want int64) string {
	switch {
	case v.expected != want:
		return fmt.Sprintf("%s to drain, want %d", plural.Count(v.expected, "row", "rows"), want)
	case v.succeeded != want:
		return fmt.Sprintf("%d of %d rows completed", v.succeeded, want)
	case v.claims != want:
		return fmt.Sprintf("%d claims for %d rows: some row was claimed more than once", v.claims, want)
	case v.otherChanged != 0:
		return plural.Count(v.otherChanged, "deferred or terminal row", "deferred or terminal rows") + " changed"
	}
	return ""
}

// vacuumCounts is how many VACUUMs of t ran so far, by autovacuum and
// by anyone else (here: the drains' vacuum policy), and how many of the
// latter ran on its ordering keys' table.
type vacuumCounts struct{ auto, manual, keys int64 }

// tableStats returns t's VACUUM counts and dead tuple estimate.
func tableStats(ctx context.Context, pool *pgxpool.Pool, t table) (vacuumCounts, int64, error) {
	g := gen.New()
	h, err := g.DiagnosticsTableHealth(ctx, pool, gen.DiagnosticsTableHealthParams{TableName: t.name})
	if err != nil {
		return vacuumCounts{}, 0, err
	}
	k, err := g.DiagnosticsTableHealth(ctx, pool, gen.DiagnosticsTableHealthParams{TableName: t.keys})
	if err != nil {
		return vacuumCounts{}, 0, err
	}
	return vacuumCounts{auto: h.AutovacuumCount, manual: h.VacuumCount, keys: k.VacuumCount}, h.DeadTuples, nil
}
