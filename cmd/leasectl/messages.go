package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// runEnqueue is "leasectl enqueue".
func runEnqueue(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("enqueue", "--queue inbox|outbox [--count N] [flags]")
	queue := fs.String("queue", "", "queue to add to: inbox or outbox (required)")
	count := fs.Int("count", 1, "number of messages, at least 1; inserted in batches of up to "+fmt.Sprint(leasing.MaxBatchSize))
	delay := fs.Duration("delay", 0, "make the messages due this long after the database's now")
	tenant := fs.String("tenant", "", "tenant id of the messages")
	msgType := fs.String("type", "", "message type name")
	topic := fs.String("topic", "", "outbox topic (outbox only)")
	orderingKey := fs.String("ordering-key", "", "ordering key: messages of one key (and tenant) are handled one at a time, in enqueue order")
	payload := fs.String("payload", "", "message body")
	asJSON := fs.Bool("json", false, "print the result, with every message id, as JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	if *count < 1 { // how many copies leasectl sends: the library never sees it
		return usagef("--count must be at least 1, got %d", *count)
	}
	template := leasing.NewMessage{
		Type: *msgType, TenantID: *tenant, Topic: *topic, OrderingKey: *orderingKey, Payload: []byte(*payload), Delay: *delay,
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	// The library checks the first batch before it connects; every batch
	// holds the same message, so bad input sends nothing.
	ids, err := enqueueMany(ctx, store, *count, func(int) leasing.NewMessage { return template })
	if err != nil {
		return c.storeError(err)
	}
	if *asJSON {
		return writeJSON(c.stdout, struct {
			Queue    leasing.Queue `json:"queue"`
			Enqueued int           `json:"enqueued"`
			IDs      []uuid.UUID   `json:"ids"`
		}{q, len(ids), ids})
	}
	due := "due now"
	if *delay > 0 {
		due = "due in " + delay.String()
	}
	fmt.Fprintf(c.stdout, "enqueued %s (%s)\n", plural.Count(len(ids), string(q)+" message", string(q)+" messages"), due)
	return nil
}

// enqueueMany enqueues count messages made by msg(i) in batches of up to
// leasing.MaxBatchSize, each batch its own transaction, and returns the ids
// of the inserted messages in order. On error the batches before the failing
// one stay committed and the error says how many.
func enqueueMany(ctx context.Context, store leasing.Store, count int, msg func(i int) leasing.NewMessage) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, count)
	batch := make([]leasing.NewMessage, 0, min(count, leasing.MaxBatchSize))
	for done := 0; done < count; {
		batch = batch[:0]
		for i := done; i < count && len(batch) < leasing.MaxBatchSize; i++ {
			batch = append(batch, msg(i))
		}
		res, err := store.Enqueue(ctx, batch...)
		if err != nil {
			if len(ids) > 0 {
				return ids, fmt.Errorf("enqueued %d of the %d messages before: %w", len(ids), count, err)
			}
			return ids, err
		}
		dup := make(map[int]bool, len(res.Duplicates))
		for _, d := range res.Duplicates {
			dup[d.Index] = true
		}
		for i, id := range res.IDs {
			if !dup[i] {
				ids = append(ids, id)
			}
		}
		done += len(batch)
	}
	return ids, nil
}

// leaseJSON is one lease as claim --json prints it.
type leaseJSON struct {
	MessageID  uuid.UUID `json:"message_id"`
	Owner      string    `json:"owner"`
	Generation int64     `json:"generation"`
	Attempt    int       `json:"attempt"`
	ExpiresAt  time.Time `json:"expires_at"`
	Type       string    `json:"type,omitempty"`
	TenantID   string    `json:"tenant_id,omitempty"`
	Topic      string    `json:"topic,omitempty"`
	// OrderingKey is the message's ordering key, when it has one.
	OrderingKey string `json:"ordering_key,omitempty"`
}

// parkedJSON is one row a claim parked, in claim --json output.
type parkedJSON struct {
	MessageID uuid.UUID `json:"message_id"`
	Reason    string    `json:"reason"`
}

// runClaim is "leasectl claim".
func runClaim(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("claim", "--queue inbox|outbox --owner O [--batch N] [--lease D] [flags]\n\n"+
		"The leases are printed and not renewed: they expire after --lease and the\n"+
		"messages become claimable again, with the attempt counted.")
	queue := fs.String("queue", "", "queue to claim from: inbox or outbox (required)")
	owner := fs.String("owner", "", "lease owner name, used as given so that operators see who holds what (required)")
	batch := fs.Int("batch", 10, fmt.Sprintf("most messages to claim, 1..%d", leasing.MaxBatchSize))
	lease := fs.Duration("lease", 30*time.Second, "lease duration, up to "+leasing.MaxLeaseDuration.String())
	tenant := fs.String("tenant", "", "claim only this tenant's messages")
	asJSON := fs.Bool("json", false, "print the leases as JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	req := leasing.ClaimRequest{Owner: *owner, BatchSize: *batch, LeaseFor: *lease, TenantID: *tenant}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	leases, err := store.Claim(ctx, req)
	// Rows the claim parked (dead-lettered as unclaimable) come with the
	// leases it took: print both, or the operator never sees those leases.
	var parkedErr *leasing.ParkedError
	parked := []leasing.ParkedRow{}
	if errors.As(err, &parkedErr) {
		parked, err = parkedErr.Parked, nil
	}
	if err != nil {
		return c.storeError(err)
	}
	for _, p := range parked {
		fmt.Fprintf(c.stderr, "leasectl claim: parked %s message %s as dead_lettered: %s\n", q, p.ID, p.Reason)
	}

	note := ""
	if len(leases) > 0 {
		note = fmt.Sprintf("note: leasectl does not renew these leases; unless %q renews or finishes them, "+
			"they expire at %s and the messages become claimable again.",
			*owner, leases[0].ExpiresAt.Format(time.RFC3339))
	}
	if *asJSON {
		out := struct {
			Queue        leasing.Queue `json:"queue"`
			Owner        string        `json:"owner"`
			LeaseSeconds float64       `json:"lease_seconds"`
			Leases       []leaseJSON   `json:"leases"`
			Parked       []parkedJSON  `json:"parked"`
		}{q, *owner, lease.Seconds(), make([]leaseJSON, len(leases)), make([]parkedJSON, len(parked))}
		for i, p := range parked {
			out.Parked[i] = parkedJSON{MessageID: p.ID, Reason: p.Reason}
		}
		for i, l := range leases {
			out.Leases[i] = leaseJSON{
				MessageID: l.Message.ID, Owner: l.Owner, Generation: l.Generation, Attempt: l.Attempt,
				ExpiresAt: l.ExpiresAt, Type: l.Message.Type, TenantID: l.Message.TenantID, Topic: l.Message.Topic,
				OrderingKey: l.Message.OrderingKey,
			}
		}
		if note != "" {
			fmt.Fprintln(c.stderr, note)
		}
		return writeJSON(c.stdout, out)
	}
	if len(leases) == 0 {
		fmt.Fprintf(c.stdout, "no due %s messages to claim\n", q)
		return nil
	}
	fmt.Fprintf(c.stdout, "claimed %s for owner %q (lease %s)\n", plural.Count(len(leases), string(q)+" message", string(q)+" messages"), *owner, *lease)
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tGENERATION\tATTEMPT\tEXPIRES AT\tORDERING KEY")
	for _, l := range leases {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", l.Message.ID, l.Generation, l.Attempt, l.ExpiresAt.Format(time.RFC3339Nano), shown(l.Message.OrderingKey))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, note)
	return nil
}
