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

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// runServe is "leasectl serve": the queue gauges of processor.RegisterQueueGauges
// over the OpenTelemetry Prometheus exporter at /metrics until SIGINT or
// SIGTERM. Each scrape reads Store.Stats, which counts the table's rows.
func runServe(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("serve", "[--metrics-addr ADDR] [--queue inbox|outbox] [--ui [--ui-addr ADDR] [--allow-writes] [--ui-token T] [--ui-sample D]]\n\n"+
		"Serves litebus.<queue>.queue.depth (by status), .expired_leases and\n"+
		".oldest_due_age at http://ADDR/metrics until interrupted, /healthz (the\n"+
		"process answers) and /readyz (the database answers and its schema is current).\n"+
		"Each scrape reads the counts from the database. --ui also serves the web\n"+
		"console (package console) at --ui-addr, read-only unless --allow-writes; on an\n"+
		"address other than localhost it requires --ui-token (or $LEASECTL_UI_TOKEN),\n"+
		"given as a bearer token or as the basic-auth password. The console samples\n"+
		"each queue's counts every --ui-sample for its depth and throughput of the\n"+
		"last hour (each sample reads the counts as a scrape does).")
	addr := fs.String("metrics-addr", ":9464", "`address` to listen on")
	queue := fs.String("queue", "", "only this queue: inbox or outbox (default both)")
	ui := fs.Bool("ui", false, "also serve the web console")
	uiAddr := fs.String("ui-addr", "127.0.0.1:8080", "`address` of the web console")
	allowWrites := fs.Bool("allow-writes", false, "let the console requeue, dead-letter and purge")
	uiToken := fs.String("ui-token", c.getenv("LEASECTL_UI_TOKEN"), "`token` the console requires (default $LEASECTL_UI_TOKEN)")
	uiSample := fs.Duration("ui-sample", 30*time.Second, "how often the console samples the queues' counts for its last hour (`duration`, at least 1s)")
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
	if *ui {
		if err := checkUIAddr(*uiAddr, *uiToken); err != nil {
			return err
		}
		if *uiSample < time.Second {
			return usagef("--ui-sample must be at least 1s, got %s", *uiSample)
		}
	} else if *allowWrites {
		return usagef("--allow-writes needs --ui")
	}

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	stores := make([]leasing.Store, len(queues))
	pgStores := make([]*leasing.Postgres, len(queues))
	for i, q := range queues {
		if pgStores[i], err = newStore(pool, q); err != nil {
			return err
		}
		stores[i] = pgStores[i]
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
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", readyz(pgStores))
	servers := []*http.Server{{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	listeners := []net.Listener{ln}
	fmt.Fprintf(c.stdout, "serving queue metrics at http://%s/metrics (interrupt to stop)\n", ln.Addr())
	var con *console.Console
	if *ui {
		var handler http.Handler
		con, handler, err = consoleHandler(c, pgStores, !*allowWrites, *uiToken, *uiSample)
		if err != nil {
			_ = ln.Close()
			return err
		}
		uiLn, err := net.Listen("tcp", *uiAddr)
		if err != nil {
			_ = ln.Close()
			return err
		}
		servers = append(servers, &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, uiLn)
		mode := "read-only"
		if *allowWrites {
			mode = "writes allowed"
		}
		fmt.Fprintf(c.stdout, "serving the console at http://%s/ (%s)\n", uiLn.Addr(), mode)
	}
	served := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { served <- srv.Serve(listeners[i]) }()
	}
	if con != nil {
		go func() { _ = con.Run(ctx) }()
		defer func() { _ = con.Close() }()
	}
	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) && serveErr == nil {
			serveErr = err
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	fmt.Fprintln(c.stdout, "stopped")
	return nil
}

// readyzTimeout bounds /readyz's database check.
const readyzTimeout = 2 * time.Second

// readyz answers 200 when every store's schema check passes (the database
// answers and is migrated for this version), else 503 with the error.
func readyz(stores []*leasing.Postgres) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyzTimeout)
		defer cancel()
		for _, s := range stores {
			if err := s.CheckSchema(ctx); err != nil {
				http.Error(w, fmt.Sprintf("not ready: %s: %v", s.Queue(), err), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	}
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
