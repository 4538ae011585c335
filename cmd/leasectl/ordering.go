package main

import (
	"context"
	"fmt"
	"strconv"
)

// runOrdering is "leasectl ordering": shows a queue's strict ordering, or
// sets it with --strict (an operator's right: db/roles.sql).
func runOrdering(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("ordering", "--queue inbox|outbox [--strict true|false] [--json]")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	strict := fs.String("strict", "", "set strict ordering: true keeps a dead-lettered head's key blocked until it is requeued or purged; false (the default) lets the key go on")
	asJSON := fs.Bool("json", false, `print {"queue": Q, "strict_ordering": B}`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	if *strict != "" {
		on, err := strconv.ParseBool(*strict)
		if err != nil {
			return usagef("--strict must be true or false, got %q", *strict)
		}
		if err := store.SetStrictOrdering(ctx, on); err != nil {
			return c.storeError(err)
		}
	}
	on, err := store.StrictOrdering(ctx)
	if err != nil {
		return c.storeError(err)
	}
	if *asJSON {
		return writeJSON(c.stdout, struct {
			Queue          string `json:"queue"`
			StrictOrdering bool   `json:"strict_ordering"`
		}{string(q), on})
	}
	mode := "default: a dead-lettered head frees its key"
	if on {
		mode = "strict: a dead-lettered head keeps its key blocked until it is requeued or purged"
	}
	_, err = fmt.Fprintf(c.stdout, "%s ordering: %s\n", q, mode)
	return err
}
