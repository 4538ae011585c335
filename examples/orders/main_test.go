package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestOrders runs the service against the local PostgreSQL and NATS: it
// skips without them, and fails under CI=true.
func TestOrders(t *testing.T) {
	natsURL := envOr("NATS_URL", nats.DefaultURL)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no NATS at %s under CI: %v", natsURL, err)
		}
		t.Skipf("no NATS at %s: %v", natsURL, err)
	}
	nc.Close()
	var out bytes.Buffer
	err = run(context.Background(), &out, config{
		AdminURL: envOr("TEST_DATABASE_URL", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")),
		NatsURL:  natsURL, Orders: 30,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "outbox: 30 published, 0 dead-lettered;")
	require.Contains(t, out.String(), "holds 30 messages")
	require.Contains(t, out.String(), "PASS: every order was placed, announced once and paid once")
}
