package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// runServe is "leasectl serve": the queue gauges of processor.RegisterQueueGauges
// over the OpenTelemetry Prometheus exporter at /metrics until SIGINT or
// SIGTERM. Each scrape reads Store.Stats, which counts the table's rows.
func runServe(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("serve", "[--metrics-addr ADDR] [--queue inbox|outbox]\n\n"+
		"Serves litebus.<queue>.queue.depth (by status), .expired_leases and\n"+
		".oldest_due_age at http://ADDR/metrics until interrupted. Each scrape reads\n"+
		"the counts from the database.")
	addr := fs.String("metrics-addr", ":9464", "`address` to listen on")
	queue := fs.String("queue", "", "only this queue: inbox or outbox (default both)")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	queues, err := parseQueues(*queue)
	if err != nil {
		return err
	}
	if err := checkListenAddr(*addr); err != nil {
		return err
	}

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	stores := make([]leasing.Store, len(queues))
	for i, q := range queues {
		if stores[i], err = newStore(pool, q); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	if _, err := processor.RegisterQueueGauges(provider.Meter("github.com/leasestore/leasestore/cmd/leasectl"), stores...); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stdout, "serving queue metrics at http://%s/metrics (interrupt to stop)\n", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Fprintln(c.stdout, "stopped")
	return nil
}

// checkListenAddr checks the syntax of a --metrics-addr value, host:port
// with an optional host and a port number (0..65535) or service name, so
// that a mistyped address is a usage error before anything starts. Whether
// the address can be bound is only known when serve listens.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--metrics-addr must be [host]:port, e.g. :9464 or 127.0.0.1:9464, got %q", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
		return usagef("--metrics-addr %q: port must be 0..65535 or a service name, got %q", addr, port)
	}
	return nil
}
