package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/leasestore/leasestore/db"
)

// runMigrate is "leasectl migrate up|down|status|sql".
func runMigrate(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("migrate", "up|down|status|roles|sql [flags]\n\n"+
		"  up      apply every pending migration\n"+
		"  down    roll back the most recently applied migration (one step)\n"+
		"  status  print the schema version and each migration's state\n"+
		"  roles   create or update the roles leasestore_processor and leasestore_operator\n"+
		"          and their grants (db/roles.sql; run it after every migration)\n"+
		"  sql     print the goose SQL files, to vendor them into your own migrations\n\n"+
		"The history is kept in the goose table "+db.VersionTable+", apart from the\n"+
		"application's goose_db_version; up, down and status first move a history\n"+
		"that an older leasectl wrote to goose_db_version (see the db package).")
	only := fs.Int64("version", 0, "sql: print only migration `N` (default all)")
	// Accept the verb before or after the flags.
	verb := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		verb, args = args[0], args[1:]
	}
	if err := c.parseLoose(fs, args); err != nil {
		return err
	}
	if verb == "" && fs.NArg() > 0 {
		verb = fs.Arg(0)
		if fs.NArg() > 1 {
			return usagef("unexpected argument %q", fs.Arg(1))
		}
	} else if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch verb {
	case "sql":
		return migrateSQL(c, *only)
	case "up", "down", "status", "roles":
		if *only != 0 {
			return usagef("--version is a flag of migrate sql")
		}
	case "":
		return usagef("say up, down or status, or roles (or sql to print the migrations)")
	default:
		return usagef("unknown migrate action %q: say up, down, status, roles or sql", verb)
	}

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if verb == "roles" {
		if err := db.ApplyRoles(ctx, pool); err != nil {
			return fmt.Errorf("apply the roles: %w", schemaHint(err, describeURL(c.databaseURL)))
		}
		fmt.Fprintln(c.stdout, "roles leasestore_processor and leasestore_operator are current (db/roles.sql)")
		return nil
	}
	moved, err := db.MoveLegacyHistory(ctx, pool)
	if err != nil {
		return err
	}
	if len(moved) > 0 {
		fmt.Fprintf(c.stdout, "moved the history of versions %v from goose_db_version to %s\n", moved, db.VersionTable)
	}
	provider, sqlDB, err := db.NewMigrator(pool)
	if err != nil {
		return err
	}
	defer sqlDB.Close()

	switch verb {
	case "up":
		err = migrateUp(ctx, c, provider)
	case "down":
		err = migrateDown(ctx, c, provider)
	default:
		return migrateStatus(ctx, c, provider)
	}
	if err != nil {
		return err
	}
	current, err := provider.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	fmt.Fprintf(c.stdout, "schema version %d\n", current)
	return nil
}

func migrateUp(ctx context.Context, c *cli, provider *goose.Provider) error {
	results, err := provider.Up(ctx)
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied
	}
	for _, r := range results {
		fmt.Fprintln(c.stdout, r)
	}
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if len(results) == 0 {
		fmt.Fprintln(c.stdout, "no pending migrations")
	}
	return nil
}

func migrateDown(ctx context.Context, c *cli, provider *goose.Provider) error {
	r, err := provider.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		fmt.Fprintln(c.stdout, "no migration is applied; nothing to roll back")
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	fmt.Fprintln(c.stdout, r)
	return nil
}

func migrateStatus(ctx context.Context, c *cli, provider *goose.Provider) error {
	statuses, err := provider.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate status: %w", err)
	}
	version, err := provider.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	var latest int64
	pending := 0
	for _, s := range statuses {
		latest = max(latest, s.Source.Version)
		if s.State == goose.StatePending {
			pending++
		}
	}
	fmt.Fprintf(c.stdout, "schema version %d (latest %d, %d pending)\n", version, latest, pending)
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tAPPLIED AT\tMIGRATION")
	for _, s := range statuses {
		applied := "-"
		if s.State == goose.StateApplied {
			applied = s.AppliedAt.UTC().Format(time.DateTime + " MST")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.State, applied, path.Base(s.Source.Path))
	}
	return tw.Flush()
}

// migrateSQL prints the embedded migration files, each after a line naming
// it, or only the file of version (unchanged, for redirecting to a file).
func migrateSQL(c *cli, version int64) error {
	files, err := fs.Glob(db.Migrations(), "*.sql")
	if err != nil {
		return err
	}
	for _, name := range files {
		v, err := goose.NumericComponent(name)
		if err != nil {
			return err
		}
		if version != 0 && v != version {
			continue
		}
		b, err := fs.ReadFile(db.Migrations(), name)
		if err != nil {
			return err
		}
		if version != 0 {
			_, err = c.stdout.Write(b)
			return err
		}
		fmt.Fprintf(c.stdout, "-- leasestore migration %s (goose version %d)\n", name, v)
		if _, err := c.stdout.Write(b); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout)
	}
	if version != 0 {
		return usagef("--version %d: no such migration; 'leasectl migrate sql' prints them all", version)
	}
	return nil
}
