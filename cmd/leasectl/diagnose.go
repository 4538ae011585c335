package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/doctor"
)

// exitCode is a command's exit status, decided and reported by the command
// itself (internal/doctor and internal/bench print their own messages).
type exitCode int

// Error implements error for a non-zero status.
func (e exitCode) Error() string { return "exit status" }

func statusOf(code int) error {
	if code == 0 {
		return nil
	}
	return exitCode(code)
}

// runDoctor checks migrations, indexes, the claim's plan and cost, lease and backlog
// health, dead rows and sessions holding back VACUUM: internal/doctor.
func runDoctor(ctx context.Context, c *cli, args []string) error {
	args, err := c.takeDatabaseFlag(args)
	if err != nil {
		return err
	}
	cfg, err := c.poolConfig() // a bad URL is a usage error, like a bad flag
	if err != nil {
		return err
	}
	connect := func(ctx context.Context) (*pgxpool.Pool, error) { return openPool(ctx, cfg) }
	// --database-url is taken out of args above; registering it again only
	// lists it in the usage.
	return statusOf(doctor.Main(ctx, connect, args, c.stdout, c.stderr, c.addDatabaseFlag))
}

// runBench fills a database of its own and drains it through the leasing
// API and through pgbench: internal/bench.
func runBench(ctx context.Context, c *cli, args []string) error {
	args, err := c.takeDatabaseFlag(args)
	if err != nil {
		return err
	}
	if _, err := c.poolConfig(); err != nil { // a bad URL is a usage error, like a bad flag
		return err
	}
	return statusOf(bench.Main(ctx, c.databaseURL, args, c.stdout, c.stderr, c.addDatabaseFlag))
}
