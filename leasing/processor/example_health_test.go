package processor_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// A platform probes a processor's liveness and readiness over HTTP.
func ExampleHealthHandler() {
	store, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	if err != nil {
		panic(err)
	}
	p, err := processor.New(store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz/", processor.HealthHandler(p)) // /healthz/livez and /healthz/readyz
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for !p.Health().Ready {
		time.Sleep(time.Millisecond)
	}
	resp, err := http.Get(srv.URL + "/healthz/readyz")
	if err != nil {
		panic(err)
	}
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode, p.Health().State)

	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println(p.Health().State)
	// Output:
	// 200 running
	// stopped
}

// A processor with a stable instance identity: after a crash, its
// restart reclaims the leases the dead run held at once, and a second
// live process with the same id refuses to run. DirectConfig must reach
// PostgreSQL directly; here the pool does.
func ExampleOptions_instanceID() {
	pool := examplePool()
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		panic(err)
	}
	p, err := processor.New(store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
		InstanceID:   "billing-0", // e.g. the StatefulSet pod's name
		DirectConfig: pool.Config().ConnConfig,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.HasPrefix(p.Owner(), "inbox@billing-0-"))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for !p.Health().Ready {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output: true
}
