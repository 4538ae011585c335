package leasing

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/gen"
)

// sqlc generates one method per table for each query; the inbox and outbox
// twins take and return structs with identical fields. queueSQL holds one
// table's methods behind the inbox-shaped types, so that the store logic in
// postgres.go is written once. The via* adapters convert between the twins;
// Go converts structs with identical fields without copying field by field.
type queueSQL struct {
	claim       func(context.Context, gen.DBTX, gen.InboxClaimParams) ([]gen.InboxClaimRow, error)
	claimTenant func(context.Context, gen.DBTX, gen.InboxClaimTenantParams) ([]gen.InboxClaimRow, error)
	renew       func(context.Context, gen.DBTX, gen.InboxRenewParams) ([]gen.InboxRenewRow, error)
	release     func(context.Context, gen.DBTX, gen.InboxReleaseParams) ([]MessageOutcome, error)
	orphans     func(context.Context, gen.DBTX, gen.InboxReleaseOrphansParams) ([]uuid.UUID, error)
	complete    func(context.Context, gen.DBTX, gen.InboxCompleteParams) ([]MessageOutcome, error)
	fail        func(context.Context, gen.DBTX, gen.InboxFailParams) ([]MessageOutcome, error)
	deadLetter  func(context.Context, gen.DBTX, gen.InboxDeadLetterParams) ([]MessageOutcome, error)
	requeue     func(context.Context, gen.DBTX, gen.InboxRequeueParams) ([]uuid.UUID, error)
	purge       func(context.Context, gen.DBTX, gen.InboxPurgeParams) (int64, error)
	counts      func(context.Context, gen.DBTX) ([]gen.InboxCountByStatusRow, error)
	health      func(context.Context, gen.DBTX, gen.InboxLeaseHealthParams) (gen.InboxLeaseHealthRow, error)
	get         func(context.Context, gen.DBTX, gen.InboxGetParams) (gen.InboxGetRow, error)
	list        func(context.Context, gen.DBTX, gen.InboxListParams) ([]gen.InboxGetRow, error)
	// enqueue and enqueueCopy differ per table (idempotency key vs topic).
	enqueue     func(context.Context, gen.DBTX, *time.Time, []NewMessage) ([]uuid.UUID, error)
	enqueueCopy func(context.Context, gen.DBTX, []NewMessage) (int64, error)
}

func sqlFor(q Queue) queueSQL {
	g := gen.New()
	if q == Outbox {
		return queueSQL{
			claim:       via(g.OutboxClaim, claimP, convertClaimRow),
			claimTenant: via(g.OutboxClaimTenant, claimTenantP, convertClaimRow),
			renew:       via(g.OutboxRenew, renewP, convertRenewRow),
			release:     via(g.OutboxRelease, releaseP, convertOutcomeRow),
			orphans:     via(g.OutboxReleaseOrphans, orphansP, same[uuid.UUID]),
			complete:    via(g.OutboxPublish, completeP, convertOutcomeRow),
			fail:        via(g.OutboxFail, failP, convertOutcomeRow),
			deadLetter:  via(g.OutboxDeadLetter, deadLetterP, convertOutcomeRow),
			requeue:     via(g.OutboxRequeue, requeueP, same[uuid.UUID]),
			purge:       viaOne(g.OutboxPurge, purgeP, same[int64]),
			counts:      viaNoArg(g.OutboxCountByStatus, convertCountRow),
			health:      viaOne(g.OutboxLeaseHealth, healthP, convertHealthRow),
			get:         viaOne(g.OutboxGet, getP, convertGetRow),
			list:        via(g.OutboxList, listP, convertGetRow),
			enqueue:     outboxEnqueue(g),
			enqueueCopy: outboxEnqueueCopy(g),
		}
	}
	return queueSQL{
		claim:       g.InboxClaim,
		claimTenant: via(g.InboxClaimTenant, same[gen.InboxClaimTenantParams], convertClaimRow),
		renew:       g.InboxRenew,
		release:     via(g.InboxRelease, same[gen.InboxReleaseParams], convertOutcomeRow),
		orphans:     g.InboxReleaseOrphans,
		complete:    via(g.InboxComplete, same[gen.InboxCompleteParams], convertOutcomeRow),
		fail:        via(g.InboxFail, same[gen.InboxFailParams], convertOutcomeRow),
		deadLetter:  via(g.InboxDeadLetter, same[gen.InboxDeadLetterParams], convertOutcomeRow),
		requeue:     g.InboxRequeue,
		purge:       g.InboxPurge,
		counts:      g.InboxCountByStatus,
		health:      g.InboxLeaseHealth,
		get:         g.InboxGet,
		list:        via(g.InboxList, same[gen.InboxListParams], convertGetRow),
		enqueue:     inboxEnqueue(g),
		enqueueCopy: inboxEnqueueCopy(g),
	}
}

// The params of each twin pair, and the rows, as type sets: converting a
// value to or from a type parameter is allowed when every member converts.
type (
	claimParams interface {
		gen.InboxClaimParams | gen.OutboxClaimParams
	}
	claimTenantParams interface {
		gen.InboxClaimTenantParams | gen.OutboxClaimTenantParams
	}
	renewParams interface {
		gen.InboxRenewParams | gen.OutboxRenewParams
	}
	releaseParams interface {
		gen.InboxReleaseParams | gen.OutboxReleaseParams
	}
	orphansParams interface {
		gen.InboxReleaseOrphansParams | gen.OutboxReleaseOrphansParams
	}
	completeParams interface {
		gen.InboxCompleteParams | gen.OutboxPublishParams
	}
	failParams interface {
		gen.InboxFailParams | gen.OutboxFailParams
	}
	deadLetterParams interface {
		gen.InboxDeadLetterParams | gen.OutboxDeadLetterParams
	}
	requeueParams interface {
		gen.InboxRequeueParams | gen.OutboxRequeueParams
	}
	purgeParams interface {
		gen.InboxPurgeParams | gen.OutboxPurgeParams
	}
	healthParams interface {
		gen.InboxLeaseHealthParams | gen.OutboxLeaseHealthParams
	}
	getParams interface {
		gen.InboxGetParams | gen.OutboxGetParams
	}
	listParams interface {
		gen.InboxListParams | gen.OutboxListParams
	}

	claimRow interface {
		gen.InboxClaimRow | gen.OutboxClaimRow | gen.InboxClaimTenantRow | gen.OutboxClaimTenantRow
	}
	renewRow interface {
		gen.InboxRenewRow | gen.OutboxRenewRow
	}
	countRow interface {
		gen.InboxCountByStatusRow | gen.OutboxCountByStatusRow
	}
	healthRow interface {
		gen.InboxLeaseHealthRow | gen.OutboxLeaseHealthRow
	}
	getRow interface {
		gen.InboxGetRow | gen.OutboxGetRow | gen.InboxListRow | gen.OutboxListRow
	}
	outcomeRow interface {
		gen.InboxReleaseRow | gen.OutboxReleaseRow | gen.InboxCompleteRow | gen.OutboxPublishRow |
			gen.InboxFailRow | gen.OutboxFailRow | gen.InboxDeadLetterRow | gen.OutboxDeadLetterRow
	}
)

// via adapts a :many query of either table to the inbox-shaped signature:
// toP converts the params to the table's twin, conv converts each row.
func via[PI, P, R, RI any](f func(context.Context, gen.DBTX, P) ([]R, error), toP func(PI) P, conv func(R) RI) func(context.Context, gen.DBTX, PI) ([]RI, error) {
	return func(ctx context.Context, db gen.DBTX, p PI) ([]RI, error) {
		rows, err := f(ctx, db, toP(p))
		if err != nil {
			return nil, err
		}
		out := make([]RI, len(rows))
		for i, r := range rows {
			out[i] = conv(r)
		}
		return out, nil
	}
}

// viaOne adapts a :one or :execrows query like via.
func viaOne[PI, P, R, RI any](f func(context.Context, gen.DBTX, P) (R, error), toP func(PI) P, conv func(R) RI) func(context.Context, gen.DBTX, PI) (RI, error) {
	return func(ctx context.Context, db gen.DBTX, p PI) (RI, error) {
		r, err := f(ctx, db, toP(p))
		return conv(r), err
	}
}

// viaNoArg adapts a :many query without parameters like via.
func viaNoArg[R, RI any](f func(context.Context, gen.DBTX) ([]R, error), conv func(R) RI) func(context.Context, gen.DBTX) ([]RI, error) {
	return func(ctx context.Context, db gen.DBTX) ([]RI, error) {
		rows, err := f(ctx, db)
		if err != nil {
			return nil, err
		}
		out := make([]RI, len(rows))
		for i, r := range rows {
			out[i] = conv(r)
		}
		return out, nil
	}
}

// Params converters: from the inbox params to the twin P of the same query.
func claimP[P claimParams](p gen.InboxClaimParams) P                   { return P(p) }
func claimTenantP[P claimTenantParams](p gen.InboxClaimTenantParams) P { return P(p) }
func renewP[P renewParams](p gen.InboxRenewParams) P                   { return P(p) }
func releaseP[P releaseParams](p gen.InboxReleaseParams) P             { return P(p) }
func orphansP[P orphansParams](p gen.InboxReleaseOrphansParams) P      { return P(p) }
func completeP[P completeParams](p gen.InboxCompleteParams) P          { return P(p) }
func failP[P failParams](p gen.InboxFailParams) P                      { return P(p) }
func deadLetterP[P deadLetterParams](p gen.InboxDeadLetterParams) P    { return P(p) }
func requeueP[P requeueParams](p gen.InboxRequeueParams) P             { return P(p) }
func purgeP[P purgeParams](p gen.InboxPurgeParams) P                   { return P(p) }
func healthP[P healthParams](p gen.InboxLeaseHealthParams) P           { return P(p) }
func getP[P getParams](p gen.InboxGetParams) P                         { return P(p) }
func listP[P listParams](p gen.InboxListParams) P                      { return P(p) }

func same[T any](v T) T { return v }

func convertClaimRow[R claimRow](r R) gen.InboxClaimRow         { return gen.InboxClaimRow(r) }
func convertRenewRow[R renewRow](r R) gen.InboxRenewRow         { return gen.InboxRenewRow(r) }
func convertCountRow[R countRow](r R) gen.InboxCountByStatusRow { return gen.InboxCountByStatusRow(r) }
func convertHealthRow[R healthRow](r R) gen.InboxLeaseHealthRow { return gen.InboxLeaseHealthRow(r) }
func convertGetRow[R getRow](r R) gen.InboxGetRow               { return gen.InboxGetRow(r) }
func convertOutcomeRow[R outcomeRow](r R) MessageOutcome {
	row := gen.InboxCompleteRow(r)
	return MessageOutcome{MessageID: row.MessageID, Outcome: Outcome(row.Outcome)}
}

// enqueueColumns is a batch of messages as the parallel arrays that the
// enqueue statements unnest; empty strings stand for NULL.
type enqueueColumns struct {
	ids      []uuid.UUID
	types    []string
	payloads [][]byte
	headers  []string
	tenants  []string
	delays   []time.Duration
}

func columnsOf(msgs []NewMessage) enqueueColumns {
	c := enqueueColumns{
		ids:      make([]uuid.UUID, len(msgs)),
		types:    make([]string, len(msgs)),
		payloads: make([][]byte, len(msgs)),
		headers:  make([]string, len(msgs)),
		tenants:  make([]string, len(msgs)),
		delays:   make([]time.Duration, len(msgs)),
	}
	for i, m := range msgs {
		c.ids[i], c.types[i], c.payloads[i] = m.ID, m.Type, m.Payload
		c.headers[i], c.tenants[i], c.delays[i] = string(m.Headers), m.TenantID, m.Delay
	}
	return c
}

func inboxEnqueue(g *gen.Queries) func(context.Context, gen.DBTX, *time.Time, []NewMessage) ([]uuid.UUID, error) {
	return func(ctx context.Context, db gen.DBTX, now *time.Time, msgs []NewMessage) ([]uuid.UUID, error) {
		c := columnsOf(msgs)
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			keys[i] = m.IdempotencyKey
		}
		return g.InboxEnqueue(ctx, db, gen.InboxEnqueueParams{
			Now: now, MessageIds: c.ids, MessageTypes: c.types, Payloads: c.payloads,
			Headers: c.headers, TenantIds: c.tenants, IdempotencyKeys: keys, Delays: c.delays,
		})
	}
}

func outboxEnqueue(g *gen.Queries) func(context.Context, gen.DBTX, *time.Time, []NewMessage) ([]uuid.UUID, error) {
	return func(ctx context.Context, db gen.DBTX, now *time.Time, msgs []NewMessage) ([]uuid.UUID, error) {
		c := columnsOf(msgs)
		topics := make([]string, len(msgs))
		for i, m := range msgs {
			topics[i] = m.Topic
		}
		return g.OutboxEnqueue(ctx, db, gen.OutboxEnqueueParams{
			Now: now, MessageIds: c.ids, MessageTypes: c.types, Payloads: c.payloads,
			Headers: c.headers, TenantIds: c.tenants, Topics: topics, Delays: c.delays,
		})
	}
}

func inboxEnqueueCopy(g *gen.Queries) func(context.Context, gen.DBTX, []NewMessage) (int64, error) {
	return func(ctx context.Context, db gen.DBTX, msgs []NewMessage) (int64, error) {
		rows := make([]gen.InboxEnqueueCopyParams, len(msgs))
		for i, m := range msgs {
			rows[i] = gen.InboxEnqueueCopyParams{
				MessageID: m.ID, MessageType: m.Type, Payload: m.Payload, Headers: m.Headers,
				TenantID: nullable(m.TenantID), IdempotencyKey: nullable(m.IdempotencyKey),
			}
		}
		return g.InboxEnqueueCopy(ctx, db, rows)
	}
}

func outboxEnqueueCopy(g *gen.Queries) func(context.Context, gen.DBTX, []NewMessage) (int64, error) {
	return func(ctx context.Context, db gen.DBTX, msgs []NewMessage) (int64, error) {
		rows := make([]gen.OutboxEnqueueCopyParams, len(msgs))
		for i, m := range msgs {
			rows[i] = gen.OutboxEnqueueCopyParams{
				MessageID: m.ID, MessageType: m.Type, Payload: m.Payload, Headers: m.Headers,
				TenantID: nullable(m.TenantID), Topic: m.Topic,
			}
		}
		return g.OutboxEnqueueCopy(ctx, db, rows)
	}
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
