package leasingtest

import "github.com/leasestore/leasestore/leasing"

// Generations returns how many times r's lease generation has changed
// since r was enqueued (claims, and releases, requeues or dead letters of
// a leased row): 0 for a row never claimed, 1 for a row claimed once. A
// store starts a new row's generations where it chooses (Postgres: at the
// enqueueing transaction's id), so a test that counts claims counts from
// the row's first claim, the first entry of its attempt history with a
// generation, or its lease when it has no finished attempt yet. It
// undercounts once the history has dropped entries (AttemptHistoryLimit).
func Generations(r leasing.Row) int64 {
	for _, a := range r.Attempts {
		if a.Generation > 0 {
			return r.LeaseGeneration - a.Generation + 1
		}
	}
	if r.LeaseOwner != "" {
		return 1
	}
	return 0
}
