package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// deadLetterJSON is dead-letter --json's output: the history entry written.
type deadLetterJSON struct {
	Queue     leasing.Queue   `json:"queue"`
	MessageID uuid.UUID       `json:"message_id"`
	Entry     leasing.Attempt `json:"entry"`
}

// runDeadLetter is "leasectl dead-letter".
func runDeadLetter(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("dead-letter", "--queue inbox|outbox --id ID --reason TEXT [--force] [--json]\n\n"+
		"Stops a poison message by hand: it becomes dead_lettered with the reason as its\n"+
		"last error, and the attempt history records that an operator did it. A message\n"+
		"that a live lease holds is refused (exit 1, nothing changed) unless --force,\n"+
		"which fences that lease: its holder's later writes are refused. Completed,\n"+
		"published and dead-lettered messages are refused. 'leasectl requeue' undoes it.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	id := idFlag(fs, "message `ID` to dead-letter (required)")
	reason := fs.String("reason", "", "why, for whoever triages the dead letters, in UTF-8; stored as the last error (required)")
	force := fs.Bool("force", false, "dead-letter even while a live lease holds the message, and fence that lease")
	asJSON := fs.Bool("json", false, "print the history entry written as JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	if *id == uuid.Nil {
		return usagef("--id is required")
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	// The library checks the reason before it connects: bad input is exit 2.
	entry, err := store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: *id, Reason: *reason, Force: *force})
	var held *leasing.LeaseHeldError
	switch {
	case errors.As(err, &held):
		return fmt.Errorf("%s message %s is leased to %q until %s: nothing changed; pass --force to dead-letter it and fence that lease",
			q, *id, held.Owner, held.ExpiresAt.Format(time.RFC3339))
	case err != nil:
		return c.storeError(err)
	}
	if *asJSON {
		return writeJSON(c.stdout, deadLetterJSON{Queue: q, MessageID: *id, Entry: entry})
	}
	fmt.Fprintf(c.stdout, "dead-lettered %s message %s after %s\n", q, *id, plural.Count(entry.Attempt, "attempt", "attempts"))
	switch {
	case entry.Forced:
		fmt.Fprintf(c.stdout, "fenced the live lease of %q (generation %d): its writes are refused from now on\n", entry.Owner, entry.Generation)
	case entry.Owner != "":
		fmt.Fprintf(c.stdout, "its lease by %q (generation %d) had expired\n", entry.Owner, entry.Generation)
	}
	return nil
}
