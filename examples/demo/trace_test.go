package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/pgadmin"
)

func TestDemoTrace(t *testing.T) {
	admin := adminURL(t)
	ctx := context.Background()
	name := "leasestore_demo_trace_" + randomHex(6)
	url, err := pgadmin.CreateDatabase(ctx, admin, name, "")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pgadmin.DropDatabase(admin, name)) })
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = db.MigrateUp(ctx, pool)
	require.NoError(t, err)

	var out bytes.Buffer
	require.NoError(t, printTrace(ctx, &out, pool), out.String())
	text := out.String()
	// The request's trace holds the send span; each attempt's claim has its
	// process span, linked to the send span, and the handler's span under it.
	for _, pattern := range []string{
		`(?m)^  trace [0-9a-f]{32}\n    POST /orders +server .*\n      send outbox +producer `,
		`(?m)^    claim outbox +client .* message_count=1 ⇠ send outbox\n      process outbox +consumer .* attempt=1 lease\.generation=\d+ process\.result=failed error\.type=handler_error write\.outcome=applied ⇠ send outbox\n        broker publish orders`,
		`(?m)^    claim outbox +client .* ⇠ send outbox\n      process outbox +consumer .* attempt=2 lease\.generation=\d+ process\.result=published write\.outcome=applied ⇠ send outbox\n        broker publish orders`,
		`(?m)^    fail outbox +client .* ⇠ process outbox #1$`,
		`(?m)^    complete outbox +client .* ⇠ process outbox #2$`,
		`(?m)^    renew outbox +client .* renew\.renewed=1$`,
	} {
		require.Regexp(t, regexp.MustCompile(pattern), text)
	}
	// The second attempt's lease is the next generation of the first's.
	gens := regexp.MustCompile(`attempt=\d+ lease\.generation=(\d+)`).FindAllStringSubmatch(text, -1)
	require.Len(t, gens, 2, text)
	first, err := strconv.ParseInt(gens[0][1], 10, 64)
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(first+1, 10), gens[1][1], text)
}

func TestPrintHistograms(t *testing.T) {
	dp := func(counts ...uint64) metricdata.HistogramDataPoint[float64] {
		var n uint64
		for _, c := range counts {
			n += c
		}
		return metricdata.HistogramDataPoint[float64]{Bounds: []float64{0.001, 0.01, 0.1}, BucketCounts: counts, Count: n, Sum: float64(n) * 0.005}
	}
	h := func(points ...metricdata.HistogramDataPoint[float64]) metricdata.Metrics {
		return metricdata.Metrics{Name: "litebus.inbox.processor.claim_duration", Data: metricdata.Histogram[float64]{DataPoints: points}}
	}
	rm := metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{
		{Metrics: []metricdata.Metrics{h(dp(50, 30, 10, 0))}},
		{Metrics: []metricdata.Metrics{h(dp(0, 0, 9, 1))}}, // a second instance: summed
	}}
	var out bytes.Buffer
	printHistograms(&out, rm)
	require.Regexp(t, `(?m)^  litebus\.inbox\.processor\.claim_duration +count +100  mean +0\.0050  p50 ≤ 0\.001 +p99 ≤ 0\.1$`, out.String())
	require.Equal(t, "+Inf", quantileBound(dp(0, 0, 0, 2), 0.5))
}
