package leasing

import (
	"bytes"
	"context"
	"slices"

	"github.com/google/uuid"
)

// ExpirePrevious implements Postgres.ExpirePrevious in memory: the
// unexpired leases of NewOwner(label) owners other than owner end at the
// store's now, owner and generation kept, for the next claim to reclaim.
func (m *Memory) ExpirePrevious(ctx context.Context, label, owner string) ([]uuid.UUID, error) {
	if err := ValidateOwnerLabel(label); err != nil {
		return nil, err
	}
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	expired := []uuid.UUID{}
	for id, r := range m.rows {
		if r.Status != m.queue.InFlight() || r.LeaseOwner == owner || !madeFrom(r.LeaseOwner, label) ||
			r.LeaseExpiresAt == nil || !r.LeaseExpiresAt.After(now) {
			continue
		}
		t := now
		r.LeaseExpiresAt = &t
		expired = append(expired, id)
	}
	slices.SortFunc(expired, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return expired, nil
}
