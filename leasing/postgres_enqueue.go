package leasing

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
)

// Enqueue implements Store.Enqueue in its own transaction. A batch without
// ordering keys also runs on a schema older than the code's.
//
// Errors, beyond Store's: ErrDuplicate for an outbox id already present;
// an *OrderingKeyConflictError for a keyed inbox duplicate of another
// ordering key; nothing is inserted after either.
func (s *Postgres) Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error) {
	return s.enqueue(ctx, nil, msgs)
}

// EnqueueTx is Enqueue inside the caller's transaction tx, so that messages
// commit or roll back with the business change that produced them: the
// transactional outbox. One INSERT statement for the whole batch, and for
// keyed messages a second that places them in their keys' lines, sent
// with it in one round trip. Begin tx
// on the store's pool or any connection to the same database, e.g. with
// pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { ... }).
//
// The INSERT runs with tx's settings, untouched: its isolation level and
// its lock_timeout, not READ COMMITTED and PostgresOptions.LockTimeout. In
// a REPEATABLE READ or SERIALIZABLE tx, an inbox duplicate that another
// transaction committed after tx took its snapshot fails the INSERT with a
// serialization failure (SQLSTATE 40001) where READ COMMITTED skips it:
// retry tx. EnqueueTx runs no schema check: keyed messages on a schema
// before migration 00010 fail with PostgreSQL's error for the missing
// column.
//
// Errors: as Enqueue's; ErrLockTimeout when tx's own lock_timeout ran
// out. After these tx is aborted.
func (s *Postgres) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...NewMessage) (EnqueueResult, error) {
	if tx == nil {
		return EnqueueResult{}, argumentError("tx", "must not be nil")
	}
	return s.enqueue(ctx, tx, msgs)
}

// InTx returns s bound to tx, an open transaction on the store's
// database: its Enqueue is EnqueueTx(ctx, tx, msgs...), with EnqueueTx's
// errors (an *ArgumentError for a nil tx). Producer code that takes a
// leasing.Enqueuer gets it in production and a Memory transaction
// (Memory.Begin) in its unit tests.
func (s *Postgres) InTx(tx pgx.Tx) Enqueuer { return txEnqueuer{s: s, tx: tx} }

// txEnqueuer is a Postgres store bound to a transaction (InTx).
type txEnqueuer struct {
	s  *Postgres
	tx pgx.Tx
}

func (e txEnqueuer) Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error) {
	return e.s.EnqueueTx(ctx, e.tx, msgs...)
}

// enqueue inserts msgs in tx, or in a transaction of its own when tx is nil.
func (s *Postgres) enqueue(ctx context.Context, tx pgx.Tx, msgs []NewMessage) (res EnqueueResult, err error) {
	msgs, err = validateMessages(s.queue, msgs)
	if err != nil {
		return EnqueueResult{}, err
	}
	ctx, span, msgs := s.tracing.send(ctx, s.queue, msgs)
	defer func() { endSend(span, len(res.Duplicates), err) }()
	c := columnsOf(s.pinned(), msgs)
	insert := bind(s.q.enqueue, c)
	steps := []step{insert}
	if c.keyed {
		// Keyed rows take their places in their keys' lines in a second
		// statement of the same transaction (EnqueueOrder).
		steps = append(steps, bind(s.q.enqueueOrder, gen.InboxEnqueueOrderParams{MessageIds: idTexts(c.ids), Now: c.now}))
	}
	switch {
	case tx != nil && c.keyed:
		err = sendIn(ctx, tx, steps...)
	case tx != nil:
		err = runIn(ctx, tx, steps...)
	case c.keyed:
		err = s.send(ctx, operator, steps...)
	default:
		err = s.send(ctx, anySchema, steps...)
	}
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: %w", s.queue, err)
	}
	stored, err := s.duplicatesOf(ctx, tx, msgs, skipped(msgs, insert.out))
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: read the ids of the stored duplicates: %w", s.queue, err)
	}
	return enqueueResult(msgs, insert.out, stored), nil
}

// duplicatesOf maps each index of skip, the messages of msgs an enqueue
// skipped, to the id of the stored message it duplicates, read in tx, or
// after the enqueue committed when tx is nil. No statement when skip is
// empty: the enqueue without duplicates costs what it did.
func (s *Postgres) duplicatesOf(ctx context.Context, tx pgx.Tx, msgs []NewMessage, skip []int) (map[int]uuid.UUID, error) {
	if len(skip) == 0 {
		return nil, nil
	}
	p := gen.InboxEnqueueDuplicatesParams{
		MessageIds: make([]string, len(skip)), TenantIds: make([]string, len(skip)), IdempotencyKeys: make([]string, len(skip)),
	}
	for j, i := range skip {
		p.MessageIds[j], p.TenantIds[j], p.IdempotencyKeys[j] = msgs[i].ID.String(), msgs[i].TenantID, msgs[i].IdempotencyKey
	}
	lookup := bind(s.q.enqueueDuplicates, p)
	var err error
	if tx != nil {
		err = runIn(ctx, tx, lookup)
	} else {
		err = s.send(ctx, anySchema, lookup)
	}
	if err != nil {
		return nil, err
	}
	stored := make(map[int]uuid.UUID, len(lookup.out))
	for _, r := range lookup.out {
		stored[skip[r.Position-1]] = r.StoredID
	}
	return stored, nil
}

// EnqueueCopy bulk-loads msgs with COPY inside the caller's transaction tx:
// the fastest way to add many messages. Rows are due at once (Delay must be
// 0) and get the database clock. Returns the ids in input order. COPY runs
// with tx's settings, as EnqueueTx does.
//
// Errors: an *ArgumentError for bad messages or a non-zero Delay;
// ErrDuplicate for an id or idempotency key already present (the whole
// copy fails); ErrLockTimeout when tx's own lock_timeout ran out;
// otherwise the driver error.
func (s *Postgres) EnqueueCopy(ctx context.Context, tx pgx.Tx, msgs ...NewMessage) ([]uuid.UUID, error) {
	msgs, err := validateMessages(s.queue, msgs)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		if m.Delay != 0 {
			return nil, argumentError("delay", "EnqueueCopy rows are due at once; use Enqueue for message %d", i)
		}
		ids[i] = m.ID
	}
	ctx, span, msgs := s.tracing.send(ctx, s.queue, msgs)
	if err := runIn(ctx, tx, bind(s.q.enqueueCopy, msgs)); err != nil {
		err = fmt.Errorf("leasing: copy into %s: %w", s.queue, err)
		endSend(span, 0, err)
		return nil, err
	}
	if hasKeys(msgs) {
		order := bind(s.q.enqueueOrder, gen.InboxEnqueueOrderParams{MessageIds: idTexts(ids), Now: s.pinned()})
		if err := runIn(ctx, tx, order); err != nil {
			err = fmt.Errorf("leasing: copy into %s: order keys: %w", s.queue, err)
			endSend(span, 0, err)
			return nil, err
		}
	}
	endSend(span, 0, nil)
	return ids, nil
}
