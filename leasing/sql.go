package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// queueSQL runs one queue's generated statements in leasing's types; the
// Postgres store calls nothing else of gen/ for its queue. inboxSQL and
// outboxSQL implement it in sql_queues.go, rendered from
// sql_queues.go.tmpl by db/render: each method fills its table's generated
// params, calls its table's generated function, passes the error through
// mapErr and converts the rows with one function per row type. db is the
// pool, the caller's transaction, or a pipeline's recording or replaying
// gen.DBTX.
type queueSQL interface {
	// claim and claimTenant return the leases taken and the rows parked
	// instead (see ParkedError), each in claim order.
	claim(ctx context.Context, db gen.DBTX, r claimArgs) ([]Lease, []ParkedRow, error)
	claimTenant(ctx context.Context, db gen.DBTX, r claimArgs) ([]Lease, []ParkedRow, error)
	// renew returns the new expiry (UTC) of each renewed message.
	renew(ctx context.Context, db gen.DBTX, f fenceArgs, leaseFor time.Duration) (map[uuid.UUID]time.Time, error)
	release(ctx context.Context, db gen.DBTX, f fenceArgs) ([]MessageOutcome, error)
	releaseOrphans(ctx context.Context, db gen.DBTX, now *time.Time, owner string, held []uuid.UUID) ([]uuid.UUID, error)
	complete(ctx context.Context, db gen.DBTX, f fenceArgs) ([]MessageOutcome, error)
	fail(ctx context.Context, db gen.DBTX, f failArgs) ([]MessageOutcome, error)
	deadLetter(ctx context.Context, db gen.DBTX, f failArgs) ([]MessageOutcome, error)
	deadLetterByID(ctx context.Context, db gen.DBTX, now *time.Time, r DeadLetterByIDRequest) (deadLetterByID, error)
	requeue(ctx context.Context, db gen.DBTX, now *time.Time, ids []uuid.UUID) ([]uuid.UUID, error)
	// requeueBatch requeues up to max of the oldest dead letters
	// dead-lettered at or before before (nil: the statement's now).
	requeueBatch(ctx context.Context, db gen.DBTX, now, before *time.Time, max int32) (requeueBatch, error)
	purge(ctx context.Context, db gen.DBTX, now *time.Time, r PurgeRequest) (int64, error)
	// countByStatus returns the rows per status; statuses without rows are absent.
	countByStatus(ctx context.Context, db gen.DBTX) (map[Status]int64, error)
	leaseHealth(ctx context.Context, db gen.DBTX, now *time.Time) (leaseHealth, error)
	// get returns ErrNotFound when the table holds no such id.
	get(ctx context.Context, db gen.DBTX, id uuid.UUID) (Row, error)
	list(ctx context.Context, db gen.DBTX, createdAt time.Time, id uuid.UUID, limit int) ([]Row, error)
	// enqueue returns the ids it inserted; a duplicate the table refuses is ErrDuplicate.
	enqueue(ctx context.Context, db gen.DBTX, now *time.Time, msgs []NewMessage) ([]uuid.UUID, error)
	enqueueCopy(ctx context.Context, db gen.DBTX, msgs []NewMessage) (int64, error)
	// enqueueOrder places the keyed rows among ids that this transaction
	// inserted in their keys' lines; returns how many it placed.
	enqueueOrder(ctx context.Context, db gen.DBTX, now *time.Time, ids []uuid.UUID) (int64, error)
	// keyLock locks the keys whose finished heads are among ids, and
	// keyAdvance, the next statement, frees them and promotes their next
	// messages (returns how many); keyAdvanceVacant does it for the keys
	// purgeHeads freed.
	keyLock(ctx context.Context, db gen.DBTX, ids []uuid.UUID) (int64, error)
	keyAdvance(ctx context.Context, db gen.DBTX, now *time.Time, ids []uuid.UUID) (int64, error)
	keyAdvanceVacant(ctx context.Context, db gen.DBTX, now *time.Time) (int64, error)
	// purgeHeads deletes dead letters that hold their keys and frees the keys.
	purgeHeads(ctx context.Context, db gen.DBTX, now *time.Time, r PurgeRequest) (int64, error)
	// orderingHealth returns the key whose head has held it longest while
	// messages wait behind it, or nil.
	orderingHealth(ctx context.Context, db gen.DBTX, now *time.Time) (*WaitingHead, error)
	// vacuum vacuums the queue's table; vacuumKeys vacuums and analyses
	// its ordering keys' table (migration 00010).
	vacuum(ctx context.Context, db gen.DBTX) error
	vacuumKeys(ctx context.Context, db gen.DBTX) error
}

// sqlFor returns the queueSQL of q, a valid queue.
func sqlFor(q Queue) queueSQL {
	if q == Outbox {
		return outboxSQL{gen.New()}
	}
	return inboxSQL{gen.New()}
}

// requeueBatch is what one RequeueBatch statement did.
type requeueBatch struct {
	// locked is the number of rows the statement locked; 0 when no dead
	// letter at or before the bound was left.
	locked int
	// requeued holds the ids moved back to pending, ordered by id, never nil.
	requeued []uuid.UUID
	// before is the bound the statement used (the database's now when it
	// was given none); zero when it locked no row.
	before time.Time
}

// claimArgs are a claim's parameters; tenantID only for claimTenant.
type claimArgs struct {
	now       *time.Time
	owner     string
	batchSize int32
	leaseFor  time.Duration
	tenantID  string
}

// fenceArgs are the leases a fenced write names: one owner, and the
// (message id, lease generation) pairs, in the same order.
type fenceArgs struct {
	now         *time.Time
	owner       string
	ids         []uuid.UUID
	generations []int64
}

// failArgs are fenceArgs with each lease's retry delay and error text, as
// last_error keeps it and as the attempt history keeps it.
type failArgs struct {
	fenceArgs
	retryDelays   []time.Duration
	lastErrors    []string
	attemptErrors []string
}

// deadLetterByID is one DeadLetterByID row: the outcome, the message's
// status, lease owner and expiry before the call, and the history entry
// written (nil when refused).
type deadLetterByID struct {
	outcome        string
	status         Status
	leaseOwner     string
	leaseExpiresAt *time.Time
	entry          []byte
}

// leaseHealth is one LeaseHealth row.
type leaseHealth struct {
	expiredLeases int64
	oldestDueAge  time.Duration
}

// mapErr is the one translation of driver errors into leasing's: SQLSTATE
// LS001 (an inbox duplicate of another ordering key) becomes an
// *OrderingKeyConflictError, a unique
// violation becomes ErrDuplicate with the server's detail, pgx.ErrNoRows
// becomes ErrNotFound, lock_not_available (SQLSTATE 55P03, the statement's
// lock_timeout ran out) becomes ErrLockTimeout wrapping the server's error,
// insufficient_privilege (SQLSTATE 42501) ErrPermissionDenied wrapping it;
// other errors, nil, and errors it already mapped pass unchanged.
func mapErr(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil, errors.Is(err, ErrLockTimeout), errors.Is(err, ErrPermissionDenied):
		return err
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return fmt.Errorf("%w: %w", ErrLockTimeout, err)
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	case errors.As(err, &pgErr) && pgErr.Code == "LS001":
		id, _ := uuid.Parse(pgErr.Detail)
		return &OrderingKeyConflictError{ID: id}
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		return fmt.Errorf("%w: %s", ErrDuplicate, pgErr.Detail)
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	}
	return err
}

// convertRows converts each generated row with conv, in order.
func convertRows[R, T any](rows []R, conv func(R) T) []T {
	out := make([]T, len(rows))
	for i, r := range rows {
		out[i] = conv(r)
	}
	return out
}

// splitClaim converts a claim's rows: a row with a parked reason was
// parked by the claim (its other columns are placeholders), every other
// row is a lease, converted with conv. Both keep the rows' order; leases is
// never nil.
func splitClaim[R any](rows []R, conv func(R) (Lease, *string)) (leases []Lease, parked []ParkedRow) {
	leases = make([]Lease, 0, len(rows))
	for _, r := range rows {
		l, reason := conv(r)
		if reason != nil {
			parked = append(parked, ParkedRow{ID: l.Message.ID, Reason: *reason})
			continue
		}
		leases = append(leases, l)
	}
	return leases, parked
}

// enqueueColumns is a batch of messages as the parallel arrays that the
// enqueue statements unnest; empty strings stand for NULL.
type enqueueColumns struct {
	ids             []uuid.UUID
	types           []string
	payloads        [][]byte
	headers         []string
	tenants         []string
	idempotencyKeys []string
	topics          []string
	orderingKeys    []string
	delays          []time.Duration
}

func columnsOf(msgs []NewMessage) enqueueColumns {
	n := len(msgs)
	c := enqueueColumns{
		ids: make([]uuid.UUID, n), types: make([]string, n), payloads: make([][]byte, n), headers: make([]string, n),
		tenants: make([]string, n), idempotencyKeys: make([]string, n), topics: make([]string, n), delays: make([]time.Duration, n),
		orderingKeys: make([]string, n),
	}
	for i, m := range msgs {
		c.ids[i], c.types[i], c.payloads[i], c.headers[i] = m.ID, m.Type, m.Payload, string(m.Headers)
		c.tenants[i], c.idempotencyKeys[i], c.topics[i], c.delays[i] = m.TenantID, m.IdempotencyKey, m.Topic, m.Delay
		c.orderingKeys[i] = m.OrderingKey
	}
	return c
}

// idTexts is ids as the text[] parameters of the queue queries: the
// canonical text form of each id, in order, never nil. pgx encodes a
// []string in every query mode without knowing the parameter's type;
// see db/queries/queue.sql.tmpl.
func idTexts(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// nullable is s as a nullable text parameter: nil for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// deref is a nullable text column as a string: "" for NULL.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// utc is a nullable timestamp column in UTC.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
