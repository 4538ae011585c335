package leasing

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

// queries are one queue's generated statements (db/queries/<queue>_*.sql),
// typed as the inbox's: the outbox's param and row structs are
// field-identical to the inbox's and convert, rows as pointers (sqlc's
// emit_result_struct_pointers). The fenced writes return InboxCompleteRow,
// the claims InboxClaimRow, the reads InboxGetRow.
type queries struct {
	claim             func(context.Context, gen.DBTX, gen.InboxClaimParams) ([]*gen.InboxClaimRow, error)
	claimTenant       func(context.Context, gen.DBTX, gen.InboxClaimTenantParams) ([]*gen.InboxClaimRow, error)
	renew             func(context.Context, gen.DBTX, gen.InboxRenewParams) ([]*gen.InboxRenewRow, error)
	release           func(context.Context, gen.DBTX, gen.InboxReleaseParams) ([]*gen.InboxCompleteRow, error)
	releaseOrphans    func(context.Context, gen.DBTX, gen.InboxReleaseOrphansParams) ([]uuid.UUID, error)
	expirePrevious    func(context.Context, gen.DBTX, gen.InboxExpirePreviousParams) ([]uuid.UUID, error)
	complete          func(context.Context, gen.DBTX, gen.InboxCompleteParams) ([]*gen.InboxCompleteRow, error)
	fail              func(context.Context, gen.DBTX, gen.InboxFailParams) ([]*gen.InboxCompleteRow, error)
	deadLetter        func(context.Context, gen.DBTX, gen.InboxDeadLetterParams) ([]*gen.InboxCompleteRow, error)
	deadLetterByID    func(context.Context, gen.DBTX, gen.InboxDeadLetterByIDParams) (*gen.InboxDeadLetterByIDRow, error)
	requeue           func(context.Context, gen.DBTX, gen.InboxRequeueParams) ([]uuid.UUID, error)
	requeueBatch      func(context.Context, gen.DBTX, gen.InboxRequeueBatchParams) ([]*gen.InboxRequeueBatchRow, error)
	purge             func(context.Context, gen.DBTX, gen.InboxPurgeParams) (int64, error)
	purgeHeads        func(context.Context, gen.DBTX, gen.InboxPurgeHeadsParams) (*gen.InboxPurgeHeadsRow, error)
	retained          func(context.Context, gen.DBTX, gen.InboxRetainedParams) (*gen.InboxRetainedRow, error)
	countByStatus     func(context.Context, gen.DBTX, struct{}) ([]*gen.InboxCountByStatusRow, error)
	leaseHealth       func(context.Context, gen.DBTX, gen.InboxLeaseHealthParams) (*gen.InboxLeaseHealthRow, error)
	get               func(context.Context, gen.DBTX, gen.InboxGetParams) (*gen.InboxGetRow, error)
	list              func(context.Context, gen.DBTX, gen.InboxListParams) ([]*gen.InboxGetRow, error)
	countMatching     func(context.Context, gen.DBTX, gen.InboxCountMatchingParams) (int64, error)
	deadLetterGroups  func(context.Context, gen.DBTX, gen.InboxDeadLetterGroupsParams) ([]*gen.InboxDeadLetterGroupsRow, error)
	purgeByIDs        func(context.Context, gen.DBTX, gen.InboxPurgeByIDsParams) ([]uuid.UUID, error)
	keyList           func(context.Context, gen.DBTX, gen.InboxKeyListParams) ([]*gen.InboxKeyListRow, error)
	enqueue           func(context.Context, gen.DBTX, enqueueColumns) ([]uuid.UUID, error)
	enqueueCopy       func(context.Context, gen.DBTX, []NewMessage) (int64, error)
	enqueueOrder      func(context.Context, gen.DBTX, gen.InboxEnqueueOrderParams) (int64, error)
	keyLock           func(context.Context, gen.DBTX, gen.InboxKeyLockParams) (int64, error)
	keyAdvance        func(context.Context, gen.DBTX, gen.InboxKeyAdvanceParams) (*gen.InboxKeyAdvanceRow, error)
	keyAdvanceVacant  func(context.Context, gen.DBTX, gen.InboxKeyAdvanceVacantParams) (*gen.InboxKeyAdvanceVacantRow, error)
	deadLetteredHeads func(context.Context, gen.DBTX, struct{}) ([]uuid.UUID, error)
	orderingHealth    func(context.Context, gen.DBTX, gen.InboxOrderingHealthParams) ([]*gen.InboxOrderingHealthRow, error)
	vacuum            func(context.Context, gen.DBTX, struct{}) (struct{}, error)
	vacuumKeys        func(context.Context, gen.DBTX, struct{}) (struct{}, error)

	// enqueueDuplicates is the inbox's only: the outbox refuses duplicates.
	enqueueDuplicates func(context.Context, gen.DBTX, gen.InboxEnqueueDuplicatesParams) ([]*gen.InboxEnqueueDuplicatesRow, error)
}

// queriesFor returns the queries of q, a valid queue.
func queriesFor(q Queue) queries {
	if q == Outbox {
		return outboxQueries(gen.New())
	}
	return inboxQueries(gen.New())
}

func inboxQueries(q *gen.Queries) queries {
	return queries{
		claim:            q.InboxClaim,
		claimTenant:      adapt(q.InboxClaimTenant, same, each(func(r *gen.InboxClaimTenantRow) *gen.InboxClaimRow { return (*gen.InboxClaimRow)(r) })),
		renew:            q.InboxRenew,
		release:          adapt(q.InboxRelease, same, each(func(r *gen.InboxReleaseRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		releaseOrphans:   q.InboxReleaseOrphans,
		expirePrevious:   q.InboxExpirePrevious,
		complete:         q.InboxComplete,
		fail:             adapt(q.InboxFail, same, each(func(r *gen.InboxFailRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		deadLetter:       adapt(q.InboxDeadLetter, same, each(func(r *gen.InboxDeadLetterRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		deadLetterByID:   q.InboxDeadLetterByID,
		requeue:          q.InboxRequeue,
		requeueBatch:     q.InboxRequeueBatch,
		purge:            q.InboxPurge,
		purgeHeads:       q.InboxPurgeHeads,
		retained:         q.InboxRetained,
		countByStatus:    noParams(q.InboxCountByStatus),
		leaseHealth:      q.InboxLeaseHealth,
		get:              q.InboxGet,
		list:             adapt(q.InboxList, same, each(func(r *gen.InboxListRow) *gen.InboxGetRow { return (*gen.InboxGetRow)(r) })),
		countMatching:    q.InboxCountMatching,
		deadLetterGroups: q.InboxDeadLetterGroups,
		purgeByIDs:       q.InboxPurgeByIDs,
		keyList:          q.InboxKeyList,
		enqueue: func(ctx context.Context, db gen.DBTX, c enqueueColumns) ([]uuid.UUID, error) {
			return inboxEnqueue(ctx, db, q, c)
		},
		enqueueCopy: func(ctx context.Context, db gen.DBTX, msgs []NewMessage) (int64, error) {
			return inboxEnqueueCopy(ctx, db, q, msgs)
		},
		enqueueOrder:      q.InboxEnqueueOrder,
		keyLock:           q.InboxKeyLock,
		keyAdvance:        q.InboxKeyAdvance,
		keyAdvanceVacant:  q.InboxKeyAdvanceVacant,
		deadLetteredHeads: noParams(q.InboxDeadLetteredHeads),
		orderingHealth:    q.InboxOrderingHealth,
		vacuum:            exec(q.InboxVacuum),
		vacuumKeys:        exec(q.InboxVacuumKeys),

		enqueueDuplicates: q.InboxEnqueueDuplicates,
	}
}

func outboxQueries(q *gen.Queries) queries {
	return queries{
		claim: adapt(q.OutboxClaim, func(p gen.InboxClaimParams) gen.OutboxClaimParams { return gen.OutboxClaimParams(p) },
			each(func(r *gen.OutboxClaimRow) *gen.InboxClaimRow { return (*gen.InboxClaimRow)(r) })),
		claimTenant: adapt(q.OutboxClaimTenant, func(p gen.InboxClaimTenantParams) gen.OutboxClaimTenantParams { return gen.OutboxClaimTenantParams(p) },
			each(func(r *gen.OutboxClaimTenantRow) *gen.InboxClaimRow { return (*gen.InboxClaimRow)(r) })),
		renew: adapt(q.OutboxRenew, func(p gen.InboxRenewParams) gen.OutboxRenewParams { return gen.OutboxRenewParams(p) },
			each(func(r *gen.OutboxRenewRow) *gen.InboxRenewRow { return (*gen.InboxRenewRow)(r) })),
		release: adapt(q.OutboxRelease, func(p gen.InboxReleaseParams) gen.OutboxReleaseParams { return gen.OutboxReleaseParams(p) },
			each(func(r *gen.OutboxReleaseRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		releaseOrphans: adapt(q.OutboxReleaseOrphans, func(p gen.InboxReleaseOrphansParams) gen.OutboxReleaseOrphansParams {
			return gen.OutboxReleaseOrphansParams(p)
		}, same),
		expirePrevious: adapt(q.OutboxExpirePrevious, func(p gen.InboxExpirePreviousParams) gen.OutboxExpirePreviousParams {
			return gen.OutboxExpirePreviousParams(p)
		}, same),
		complete: adapt(q.OutboxPublish, func(p gen.InboxCompleteParams) gen.OutboxPublishParams { return gen.OutboxPublishParams(p) },
			each(func(r *gen.OutboxPublishRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		fail: adapt(q.OutboxFail, func(p gen.InboxFailParams) gen.OutboxFailParams { return gen.OutboxFailParams(p) },
			each(func(r *gen.OutboxFailRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		deadLetter: adapt(q.OutboxDeadLetter, func(p gen.InboxDeadLetterParams) gen.OutboxDeadLetterParams { return gen.OutboxDeadLetterParams(p) },
			each(func(r *gen.OutboxDeadLetterRow) *gen.InboxCompleteRow { return (*gen.InboxCompleteRow)(r) })),
		deadLetterByID: adapt(q.OutboxDeadLetterByID, func(p gen.InboxDeadLetterByIDParams) gen.OutboxDeadLetterByIDParams {
			return gen.OutboxDeadLetterByIDParams(p)
		},
			func(r *gen.OutboxDeadLetterByIDRow) *gen.InboxDeadLetterByIDRow {
				return (*gen.InboxDeadLetterByIDRow)(r)
			}),
		requeue: adapt(q.OutboxRequeue, func(p gen.InboxRequeueParams) gen.OutboxRequeueParams { return gen.OutboxRequeueParams(p) }, same),
		requeueBatch: adapt(q.OutboxRequeueBatch, func(p gen.InboxRequeueBatchParams) gen.OutboxRequeueBatchParams {
			return gen.OutboxRequeueBatchParams(p)
		},
			each(func(r *gen.OutboxRequeueBatchRow) *gen.InboxRequeueBatchRow { return (*gen.InboxRequeueBatchRow)(r) })),
		purge: adapt(q.OutboxPurge, func(p gen.InboxPurgeParams) gen.OutboxPurgeParams { return gen.OutboxPurgeParams(p) }, same),
		purgeHeads: adapt(q.OutboxPurgeHeads, func(p gen.InboxPurgeHeadsParams) gen.OutboxPurgeHeadsParams { return gen.OutboxPurgeHeadsParams(p) },
			func(r *gen.OutboxPurgeHeadsRow) *gen.InboxPurgeHeadsRow { return (*gen.InboxPurgeHeadsRow)(r) }),
		retained: adapt(q.OutboxRetained, func(p gen.InboxRetainedParams) gen.OutboxRetainedParams { return gen.OutboxRetainedParams(p) },
			func(r *gen.OutboxRetainedRow) *gen.InboxRetainedRow { return (*gen.InboxRetainedRow)(r) }),
		countByStatus: adapt(noParams(q.OutboxCountByStatus), same,
			each(func(r *gen.OutboxCountByStatusRow) *gen.InboxCountByStatusRow { return (*gen.InboxCountByStatusRow)(r) })),
		leaseHealth: adapt(q.OutboxLeaseHealth, func(p gen.InboxLeaseHealthParams) gen.OutboxLeaseHealthParams { return gen.OutboxLeaseHealthParams(p) },
			func(r *gen.OutboxLeaseHealthRow) *gen.InboxLeaseHealthRow { return (*gen.InboxLeaseHealthRow)(r) }),
		get: adapt(q.OutboxGet, func(p gen.InboxGetParams) gen.OutboxGetParams { return gen.OutboxGetParams(p) },
			func(r *gen.OutboxGetRow) *gen.InboxGetRow { return (*gen.InboxGetRow)(r) }),
		list: adapt(q.OutboxList, func(p gen.InboxListParams) gen.OutboxListParams { return gen.OutboxListParams(p) },
			each(func(r *gen.OutboxListRow) *gen.InboxGetRow { return (*gen.InboxGetRow)(r) })),
		countMatching: adapt(q.OutboxCountMatching, func(p gen.InboxCountMatchingParams) gen.OutboxCountMatchingParams {
			return gen.OutboxCountMatchingParams(p)
		}, same),
		deadLetterGroups: adapt(q.OutboxDeadLetterGroups, func(p gen.InboxDeadLetterGroupsParams) gen.OutboxDeadLetterGroupsParams {
			return gen.OutboxDeadLetterGroupsParams(p)
		},
			each(func(r *gen.OutboxDeadLetterGroupsRow) *gen.InboxDeadLetterGroupsRow {
				return (*gen.InboxDeadLetterGroupsRow)(r)
			})),
		purgeByIDs: adapt(q.OutboxPurgeByIDs, func(p gen.InboxPurgeByIDsParams) gen.OutboxPurgeByIDsParams { return gen.OutboxPurgeByIDsParams(p) }, same),
		keyList: adapt(q.OutboxKeyList, func(p gen.InboxKeyListParams) gen.OutboxKeyListParams { return gen.OutboxKeyListParams(p) },
			each(func(r *gen.OutboxKeyListRow) *gen.InboxKeyListRow { return (*gen.InboxKeyListRow)(r) })),
		enqueue: func(ctx context.Context, db gen.DBTX, c enqueueColumns) ([]uuid.UUID, error) {
			return outboxEnqueue(ctx, db, q, c)
		},
		enqueueCopy: func(ctx context.Context, db gen.DBTX, msgs []NewMessage) (int64, error) {
			return outboxEnqueueCopy(ctx, db, q, msgs)
		},
		enqueueOrder: adapt(q.OutboxEnqueueOrder, func(p gen.InboxEnqueueOrderParams) gen.OutboxEnqueueOrderParams {
			return gen.OutboxEnqueueOrderParams(p)
		}, same),
		keyLock: adapt(q.OutboxKeyLock, func(p gen.InboxKeyLockParams) gen.OutboxKeyLockParams { return gen.OutboxKeyLockParams(p) }, same),
		keyAdvance: adapt(q.OutboxKeyAdvance, func(p gen.InboxKeyAdvanceParams) gen.OutboxKeyAdvanceParams { return gen.OutboxKeyAdvanceParams(p) },
			func(r *gen.OutboxKeyAdvanceRow) *gen.InboxKeyAdvanceRow { return (*gen.InboxKeyAdvanceRow)(r) }),
		keyAdvanceVacant: adapt(q.OutboxKeyAdvanceVacant, func(p gen.InboxKeyAdvanceVacantParams) gen.OutboxKeyAdvanceVacantParams {
			return gen.OutboxKeyAdvanceVacantParams(p)
		},
			func(r *gen.OutboxKeyAdvanceVacantRow) *gen.InboxKeyAdvanceVacantRow {
				return (*gen.InboxKeyAdvanceVacantRow)(r)
			}),
		orderingHealth: adapt(q.OutboxOrderingHealth, func(p gen.InboxOrderingHealthParams) gen.OutboxOrderingHealthParams {
			return gen.OutboxOrderingHealthParams(p)
		},
			each(func(r *gen.OutboxOrderingHealthRow) *gen.InboxOrderingHealthRow {
				return (*gen.InboxOrderingHealthRow)(r)
			})),
		vacuum:            exec(q.OutboxVacuum),
		vacuumKeys:        exec(q.OutboxVacuumKeys),
		deadLetteredHeads: noParams(q.OutboxDeadLetteredHeads),
	}
}

// adapt returns f with its params converted by p and its result by r.
func adapt[P, Q, R, S any](f func(context.Context, gen.DBTX, Q) (S, error), p func(P) Q, r func(S) R) func(context.Context, gen.DBTX, P) (R, error) {
	return func(ctx context.Context, db gen.DBTX, arg P) (R, error) {
		out, err := f(ctx, db, p(arg))
		return r(out), err
	}
}

// same is the conversion of a type that needs none.
func same[T any](t T) T { return t }

// each converts a slice with conv, in order.
func each[S, R any](conv func(S) R) func([]S) []R {
	return func(rows []S) []R {
		out := make([]R, len(rows))
		for i, r := range rows {
			out[i] = conv(r)
		}
		return out
	}
}

// noParams gives f, which takes no params, the shape of the others.
func noParams[R any](f func(context.Context, gen.DBTX) (R, error)) func(context.Context, gen.DBTX, struct{}) (R, error) {
	return func(ctx context.Context, db gen.DBTX, _ struct{}) (R, error) { return f(ctx, db) }
}

// exec gives f, which takes no params and returns no rows, the shape of the others.
func exec(f func(context.Context, gen.DBTX) error) func(context.Context, gen.DBTX, struct{}) (struct{}, error) {
	return noRows(func(ctx context.Context, db gen.DBTX, _ struct{}) error { return f(ctx, db) })
}

// noRows gives f, which returns no rows, the shape of the others.
func noRows[P any](f func(context.Context, gen.DBTX, P) error) func(context.Context, gen.DBTX, P) (struct{}, error) {
	return func(ctx context.Context, db gen.DBTX, arg P) (struct{}, error) { return struct{}{}, f(ctx, db, arg) }
}

// The enqueues differ by one column: the inbox's idempotency keys, the
// outbox's topics. Keyed batches go through EnqueueOrdered.

func inboxEnqueue(ctx context.Context, db gen.DBTX, q *gen.Queries, c enqueueColumns) ([]uuid.UUID, error) {
	if !c.keyed {
		return q.InboxEnqueue(ctx, db, gen.InboxEnqueueParams{
			Now: c.now, MessageIds: idTexts(c.ids), MessageTypes: c.types, Payloads: c.payloads, Headers: c.headers,
			TenantIds: c.tenants, IdempotencyKeys: c.idempotencyKeys, Delays: c.delays,
		})
	}
	return q.InboxEnqueueOrdered(ctx, db, gen.InboxEnqueueOrderedParams{
		Now: c.now, MessageIds: idTexts(c.ids), MessageTypes: c.types, Payloads: c.payloads, Headers: c.headers,
		TenantIds: c.tenants, IdempotencyKeys: c.idempotencyKeys, OrderingKeys: c.orderingKeys, Delays: c.delays,
	})
}

func outboxEnqueue(ctx context.Context, db gen.DBTX, q *gen.Queries, c enqueueColumns) ([]uuid.UUID, error) {
	if !c.keyed {
		return q.OutboxEnqueue(ctx, db, gen.OutboxEnqueueParams{
			Now: c.now, MessageIds: idTexts(c.ids), MessageTypes: c.types, Payloads: c.payloads, Headers: c.headers,
			TenantIds: c.tenants, Topics: c.topics, Delays: c.delays,
		})
	}
	return q.OutboxEnqueueOrdered(ctx, db, gen.OutboxEnqueueOrderedParams{
		Now: c.now, MessageIds: idTexts(c.ids), MessageTypes: c.types, Payloads: c.payloads, Headers: c.headers,
		TenantIds: c.tenants, Topics: c.topics, OrderingKeys: c.orderingKeys, Delays: c.delays,
	})
}

func inboxEnqueueCopy(ctx context.Context, db gen.DBTX, q *gen.Queries, msgs []NewMessage) (int64, error) {
	rows := make([]gen.InboxEnqueueCopyParams, len(msgs))
	for i, m := range msgs {
		rows[i] = gen.InboxEnqueueCopyParams{
			MessageID: m.ID, MessageType: m.Type, Payload: m.Payload, Headers: m.Headers, TenantID: nullable(m.TenantID),
			IdempotencyKey: nullable(m.IdempotencyKey), OrderingKey: nullable(m.OrderingKey), Status: string(initialStatus(m)),
		}
	}
	return q.InboxEnqueueCopy(ctx, db, rows)
}

func outboxEnqueueCopy(ctx context.Context, db gen.DBTX, q *gen.Queries, msgs []NewMessage) (int64, error) {
	rows := make([]gen.OutboxEnqueueCopyParams, len(msgs))
	for i, m := range msgs {
		rows[i] = gen.OutboxEnqueueCopyParams{
			MessageID: m.ID, MessageType: m.Type, Payload: m.Payload, Headers: m.Headers, TenantID: nullable(m.TenantID),
			Topic: m.Topic, OrderingKey: nullable(m.OrderingKey), Status: string(initialStatus(m)),
		}
	}
	return q.OutboxEnqueueCopy(ctx, db, rows)
}

// enqueueColumns is a batch of messages as the parallel arrays that the
// enqueue statements unnest; empty strings stand for NULL. keyed selects
// EnqueueOrdered.
type enqueueColumns struct {
	now             *time.Time
	keyed           bool
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

func columnsOf(now *time.Time, msgs []NewMessage) enqueueColumns {
	n := len(msgs)
	c := enqueueColumns{
		now: now, keyed: hasKeys(msgs),
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
