package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// exportedMetrics runs a processor on each queue through the Prometheus
// exporter leasectl serve uses, with one message that succeeds and one
// that fails until it is dead-lettered, and returns the names a scrape
// shows: each family, and a histogram's _bucket, _sum and _count series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	url := dbtest.DatabaseURL(t)
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	meter := provider.Meter("test")
	var stores []leasing.Store
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store := storeFor(t, url, q)
		stores = append(stores, store)
		_, err := store.Enqueue(t.Context(), leasing.NewMessage{Type: "ok"}, leasing.NewMessage{Type: "bad"})
		require.NoError(t, err)
		p, err := processor.New(store, func(_ context.Context, l leasing.Lease) error {
			if l.Message.Type == "bad" {
				return errors.New("bad message")
			}
			return nil
		}, processor.Options{Meter: meter, PollInterval: 10 * time.Millisecond,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Millisecond}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool {
			st, err := store.Stats(t.Context())
			require.NoError(t, err)
			return st.Depth[q.Succeeded()] == 1 && st.Depth[leasing.StatusDeadLettered] == 1
		}, 30*time.Second, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}
	_, err = processor.RegisterQueueGauges(meter, stores...)
	require.NoError(t, err)
	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}

var metricRE = regexp.MustCompile(`\blitebus_[a-z0-9_]+`)

// TestMonitoringNamesExportedMetrics: the Grafana dashboard and the alert
// rules under deploy/ parse, and every metric they name is exported.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)

	var exprs []string
	raw, err := os.ReadFile("../../deploy/grafana/leasestore.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}

	raw, err = os.ReadFile("../../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	require.NotEmpty(t, rules.Groups)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			exprs = append(exprs, r.Expr)
		}
	}

	named := map[string]bool{}
	for _, e := range exprs {
		require.Equal(t, strings.Count(e, "("), strings.Count(e, ")"), e)
		found := metricRE.FindAllString(e, -1)
		require.NotEmpty(t, found, e)
		for _, m := range found {
			named[m] = true
		}
	}
	var unknown []string
	for m := range named {
		if !exported[m] {
			unknown = append(unknown, m)
		}
	}
	sort.Strings(unknown)
	require.Empty(t, unknown, "named in deploy/ but not exported; exported: %v", exported)
	require.Greater(t, len(named), 20)
}
