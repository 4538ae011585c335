package leasing

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasestore/leasestore/gen"
)

// Claim implements Store.Claim with one statement (db/queries/claim.sql.tmpl).
// Rows it parks come back as a *ParkedError beside the leases.
func (s *Postgres) Claim(ctx context.Context, r ClaimRequest) ([]Lease, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	claim := s.claim(r)
	if err := s.send(ctx, hotPath, claim); err != nil {
		return nil, fmt.Errorf("leasing: claim %s: %w", s.queue, err)
	}
	leases, parked := claimed(s.queue, r.Owner, claim.result())
	return leases, parkedError(s.queue, parked, s.freeParkedKeys(ctx, parked))
}

// CompleteAndClaim sends the Complete statement (with the key steps of the
// keyed leases among done) and the Claim statement in one batch, one round
// trip and one transaction (one WAL flush). With no done leases
// it is Claim. The claim sees the messages promoted by the keys the
// completions freed, but for the keys of leases that named none (see
// Lease), which are freed after the call's transaction: Memory's claim
// sees those too.
//
// Errors: as Complete's and Claim's. An error after the call committed
// (freeing keys, as Complete's, or a *ParkedError) comes with the
// outcomes and the leases, which are valid.
func (s *Postgres) CompleteAndClaim(ctx context.Context, done []Lease, r ClaimRequest) (WriteResult, []Lease, error) {
	if len(done) == 0 {
		leases, err := s.Claim(ctx, r)
		return WriteResult{Outcomes: []MessageOutcome{}}, leases, err
	}
	owner, err := validateLeases(s.queue, done)
	if err == nil {
		err = r.Validate()
	}
	if err != nil {
		return WriteResult{}, nil, err
	}
	f := s.fence(owner, done)
	complete := s.complete(f)
	claim := s.claim(r)
	// The keys the completes free are promoted before the claim, which
	// then sees the promoted messages.
	steps := append(append([]step{complete}, s.keySteps(keyedIDs(done))...), claim)
	if err = s.send(ctx, hotPath, steps...); err != nil {
		return WriteResult{}, nil, fmt.Errorf("leasing: complete and claim %s: %w", s.queue, err)
	}
	res := WriteResult{Outcomes: outcomes(f.ids, complete.result())}
	unnamed := s.freeUnnamedKeys(ctx, complete.result(), done)
	leases, parked := claimed(s.queue, r.Owner, claim.result())
	return res, leases, errors.Join(unnamed, parkedError(s.queue, parked, s.freeParkedKeys(ctx, parked)))
}

// claim returns the claim statement for r: the tenant's claim when r
// names a tenant.
func (s *Postgres) claim(r ClaimRequest) result[[]*gen.InboxClaimRow] {
	now, size := s.pinned(), int32(r.BatchSize)
	topics, except := r.Topics, r.ExceptTopics
	if r.TenantID != "" {
		return bind(s.q.claimTenant, gen.InboxClaimTenantParams{
			Now: now, TenantID: r.TenantID, BatchSize: size, LeaseOwner: r.Owner, LeaseFor: r.LeaseFor,
			Topics: topics, ExceptTopics: except,
		})
	}
	return bind(s.q.claim, gen.InboxClaimParams{
		Now: now, BatchSize: size, LeaseOwner: r.Owner, LeaseFor: r.LeaseFor, Topics: topics, ExceptTopics: except,
	})
}
