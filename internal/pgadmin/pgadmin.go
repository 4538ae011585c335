// Package pgadmin creates and drops the throwaway databases that tests,
// the demo and the benchmark work in, through an admin connection string.
// Tests get theirs through internal/dbtest, which names them for the test
// run and sweeps dead runs' leftovers.
package pgadmin

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// connectTimeout bounds a connection attempt when adminURL sets no
// connect_timeout, so that a server that went away fails a call instead of
// hanging it.
const connectTimeout = 10 * time.Second

// Exec runs one statement on a new connection to adminURL. DDL such as
// CREATE DATABASE takes no parameters: callers quote every name with
// pgx.Identifier.
func Exec(ctx context.Context, adminURL, sql string) error {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return err
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// WithDatabase returns connection string u with its database set to name.
// u is a postgres:// URL or a keyword/value string, where a later dbname
// overrides an earlier one.
//
// Errors: u is neither.
func WithDatabase(u, name string) (string, error) {
	if parsed, err := url.Parse(u); err == nil && (parsed.Scheme == "postgres" || parsed.Scheme == "postgresql") {
		parsed.Path = "/" + name
		parsed.RawPath = ""
		return parsed.String(), nil
	}
	if _, err := pgx.ParseConfig(u); err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	return u + " dbname=" + name, nil
}

// CreateDatabase creates database name (a copy of template, or of the
// server's default template when template is empty) on adminURL's server
// and returns the new database's connection string.
//
// Errors: the server's, e.g. when the role lacks CREATEDB.
func CreateDatabase(ctx context.Context, adminURL, name, template string) (string, error) {
	dbURL, err := WithDatabase(adminURL, name)
	if err != nil {
		return "", err
	}
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := Exec(ctx, adminURL, create); err != nil {
		return "", err
	}
	return dbURL, nil
}

// DropDatabase drops database name if it exists, ending its sessions. It
// runs on its own context with a one-minute timeout, so that it also
// cleans up after the caller's context was cancelled.
func DropDatabase(adminURL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return Exec(ctx, adminURL, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Redact returns u, a postgres:// URL, with its password hidden, for
// messages; for a connection string of another form, a phrase naming none
// of it.
func Redact(u string) string {
	if parsed, err := url.Parse(u); err == nil && parsed.Scheme != "" {
		return parsed.Redacted()
	}
	return "the configured server"
}

// Ping connects to adminURL and pings the server, within 5 seconds.
//
// Errors: the connection's or the ping's.
func Ping(adminURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}
