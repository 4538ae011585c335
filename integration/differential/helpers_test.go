package differential_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	freshURL   = dbtest.DatabaseURL
	newPool    = dbtest.OpenPool
	queuesBoth = dbtest.Queues
)

const emptyQueues = dbtest.EmptyQueues

// pick returns short in the always-on form and long under -stress.
func pick[T any](short, long T) T { return dbtest.Pick(short, long) }
