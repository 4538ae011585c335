package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/leasing"
)

// defaultDatabaseURL is the server used when neither --database-url nor
// DATABASE_URL is given: the local server scripts/db-start.sh starts.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// connectTimeout bounds the first connection to the server.
const connectTimeout = 10 * time.Second

// urlSource says where the database URL came from.
type urlSource int

const (
	urlDefault urlSource = iota // neither the flag nor DATABASE_URL
	urlEnv                      // DATABASE_URL
	urlFlag                     // --database-url
)

// cli is the state shared by the subcommands: output streams and the
// database URL.
type cli struct {
	stdin          io.Reader // confirmations (bulk)
	getenv         func(string) string
	stdout, stderr io.Writer
	databaseURL    string
	source         urlSource
	warned         bool // the default URL's warning was printed
}

func newCLI(stdout, stderr io.Writer, getenv func(string) string) *cli {
	c := &cli{stdin: os.Stdin, getenv: getenv, stdout: stdout, stderr: stderr, databaseURL: defaultDatabaseURL, source: urlDefault}
	if u := getenv("DATABASE_URL"); u != "" {
		c.databaseURL, c.source = u, urlEnv
	}
	return c
}

// usageError is bad input: exit status 2, nothing changed.
type usageError struct{ msg string }

// Error returns the message, which names the offending flag or argument.
func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// addDatabaseFlag registers --database-url on fs. Its default is not shown
// as a value because DATABASE_URL may hold a password.
func (c *cli) addDatabaseFlag(fs *flag.FlagSet) {
	fs.Func("database-url", "PostgreSQL `URL` (default $DATABASE_URL, else "+defaultDatabaseURL+")", func(s string) error {
		if s == "" {
			return errors.New("must not be empty")
		}
		c.databaseURL, c.source = s, urlFlag
		return nil
	})
}

// takeDatabaseFlag applies the --database-url flags in args (any of
// -database-url, --database-url, with the value after = or as the next
// argument; none after a "--" argument) and returns the other arguments, in
// order, for commands whose flags another package parses.
func (c *cli) takeDatabaseFlag(args []string) ([]string, error) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	c.addDatabaseFlag(fs)
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "database-url" {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return nil, usagef("flag needs an argument: -database-url")
			}
			i++
			value = args[i]
		}
		if err := fs.Set("database-url", value); err != nil {
			return nil, usagef("invalid value %q for flag -database-url: %v", value, err)
		}
	}
	return rest, nil
}

// newFlagSet returns the flag set of subcommand name, printing errors and
// usage to stderr, with --database-url registered.
func (c *cli) newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("leasectl "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: leasectl %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	c.addDatabaseFlag(fs)
	return fs
}

// parse parses args into fs and rejects positional arguments.
func (c *cli) parse(fs *flag.FlagSet, args []string) error {
	if err := c.parseLoose(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// parseLoose parses args into fs and leaves positional arguments in fs.Args.
func (c *cli) parseLoose(fs *flag.FlagSet, args []string) error {
	// The flag package prints the error and the whole usage on a bad flag;
	// print one clear line instead (exitStatus), and the usage only for -h.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return usagef("%v", err)
	}
	return nil
}

// parseQueue returns the queue named by --queue, which is required.
func parseQueue(s string) (leasing.Queue, error) {
	if s == "" {
		return "", usagef("--queue is required: inbox or outbox")
	}
	q, err := leasing.ParseQueue(s)
	return q, flagError(err)
}

// parseQueues returns the queues an optional --queue names: both when s is
// empty, else the one it names.
func parseQueues(s string) ([]leasing.Queue, error) {
	if s == "" {
		return []leasing.Queue{leasing.Inbox, leasing.Outbox}, nil
	}
	q, err := parseQueue(s)
	if err != nil {
		return nil, err
	}
	return []leasing.Queue{q}, nil
}

// argumentFlags maps the Field of the library's *leasing.ArgumentError to
// the flags that set it. The library checks every value the flags carry;
// leasectl checks only flag syntax and which flags go together.
var argumentFlags = map[string]string{
	"queue":          "--queue",
	"owner":          "--owner",
	"batch size":     "--batch",
	"purge batch":    "--batch",
	"lease duration": "--lease",
	"older than":     "--older-than",
	"delay":          "--delay",
	"payload":        "--payload",
	"topic":          "--topic",
	"type":           "--type",
	"tenant id":      "--tenant",
	"ordering key":   "--ordering-key",
	"message id":     "--id",
	"message ids":    "--id",
	"reason":         "--reason",
}

// flagError turns an *leasing.ArgumentError into a usage error (exit status
// 2) that names the flag (argumentFlags); other errors pass through.
func flagError(err error) error {
	var ae *leasing.ArgumentError
	if !errors.As(err, &ae) {
		return err
	}
	if f, ok := argumentFlags[ae.Field]; ok {
		return usagef("%s %s", f, ae.Reason)
	}
	return usagef("%s: %s", ae.Field, ae.Reason)
}

// storeError is the error of a store call made through lazyPool's pool: a
// usage error for the library's *leasing.ArgumentError, the server named
// when the first connection failed, the fix when the schema is missing.
func (c *cli) storeError(err error) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &unreachableError{server: describeURL(c.databaseURL), err: err}
	}
	if errors.Is(err, leasing.ErrSchema) {
		return fmt.Errorf("%w (database %s)", err, describeURL(c.databaseURL))
	}
	return flagError(schemaHint(err, describeURL(c.databaseURL)))
}

// unreachableError is a failure to connect to server (user@host:port/db):
// exit status 1. Its message lists each failed attempt once.
type unreachableError struct {
	server string
	err    error
}

// Error returns "cannot reach PostgreSQL at <server>: <err>", each dial
// error of err once (pgadmin.ErrorText).
func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach PostgreSQL at %s: %s", e.server, pgadmin.ErrorText(e.err))
}

func (e *unreachableError) Unwrap() error { return e.err }

// poolConfig parses the database URL. A URL of another scheme than
// postgres:// or postgresql:// is a usage error that says so; no message
// prints the URL's password.
func (c *cli) poolConfig() (*pgxpool.Config, error) {
	if c.source == urlDefault && !c.warned {
		c.warned = true
		fmt.Fprintf(c.stderr, "leasectl: neither --database-url nor DATABASE_URL is set: using database %s\n", describeURL(c.databaseURL))
	}
	if err := pgadmin.CheckScheme(c.databaseURL); err != nil {
		return nil, usagef("bad database URL: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, usagef("bad database URL: %v", err)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "leasectl"
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	return cfg, nil
}

// lazyPool opens a pool on the database URL that connects on first use, so
// that a store call with bad arguments returns the library's
// *leasing.ArgumentError before any connection is tried: bad input is exit
// status 2 even when the server is down. Pass the store calls' errors
// through storeError. Close the pool when done.
func (c *cli) lazyPool() (*pgxpool.Pool, error) {
	cfg, err := c.poolConfig()
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// lazyStore is newStore over a new lazyPool: the store of queue q, which
// connects on its first call. Close its Pool when done.
func (c *cli) lazyStore(q leasing.Queue) (*leasing.Postgres, error) {
	pool, err := c.lazyPool()
	if err != nil {
		return nil, err
	}
	store, err := newStore(pool, q)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return store, nil
}

// connect opens a pool on the database URL and checks that the server
// answers. Close the pool when done.
func (c *cli) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := c.poolConfig()
	if err != nil {
		return nil, err
	}
	return openPool(ctx, cfg)
}

func openPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", describe(cfg.ConnConfig), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, &unreachableError{server: describe(cfg.ConnConfig), err: err}
	}
	return pool, nil
}

// newStore returns the Postgres store of queue q over pool.
func newStore(pool *pgxpool.Pool, q leasing.Queue) (*leasing.Postgres, error) {
	return leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
}

// describe names a server and database without the password:
// user@host:port/database.
func describe(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// describeURL is describe for a connection string.
func describeURL(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "the configured server"
	}
	return describe(cfg)
}

// schemaHint adds the fix to an error caused by a missing table or a
// missing privilege.
func schemaHint(err error, database string) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("%w (the schema is missing from %s: run 'leasectl migrate up' on it)", err, database)
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		return fmt.Errorf("%w (this role lacks the privilege: db/roles.sql grants what processors need to leasestore_processor, and what operators also need, to purge, delete or set strict ordering, to leasestore_operator; leasectl doctor lists what a processor's role lacks)", err)
	}
	return err
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
