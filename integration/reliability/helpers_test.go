package reliability_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn       = dbtest.AdminConn
	failureLeases   = dbtest.FailureLeases
	freshURL        = dbtest.DatabaseURL
	isArgErr        = dbtest.IsArgErr
	long            = dbtest.Long
	newPool         = dbtest.OpenPool
	openStore       = dbtest.OpenStore
	queuesBoth      = dbtest.Queues
	tableDigest     = dbtest.TableDigest
	tableOf         = dbtest.TableOf
	waitForLockWait = dbtest.WaitForLockWait
	waitStatus      = dbtest.WaitStatus
)

// pick returns short in the always-on form and long under -stress.
func pick[T any](short, long T) T { return dbtest.Pick(short, long) }
