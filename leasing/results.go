package leasing

import (
	"time"

	"github.com/google/uuid"
)

// enqueueResult reports msgs against the ids the store inserted.
func enqueueResult(msgs []NewMessage, inserted []uuid.UUID) EnqueueResult {
	done := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		done[id] = true
	}
	res := EnqueueResult{IDs: make([]uuid.UUID, len(msgs)), Duplicates: []uuid.UUID{}}
	for i, m := range msgs {
		res.IDs[i] = m.ID
		if !done[m.ID] {
			res.Duplicates = append(res.Duplicates, m.ID)
		}
	}
	return res
}

// renewResult splits leases into renewed (with new expiry) and lost.
func renewResult(leases []Lease, expiry map[uuid.UUID]time.Time) RenewResult {
	res := RenewResult{Renewed: []Lease{}, Lost: []uuid.UUID{}}
	for _, l := range leases {
		if t, ok := expiry[l.Message.ID]; ok {
			l.ExpiresAt = t
			res.Renewed = append(res.Renewed, l)
		} else {
			res.Lost = append(res.Lost, l.Message.ID)
		}
	}
	return res
}
