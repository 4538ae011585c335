package leasing_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn          = dbtest.AdminConn
	applyRoles         = dbtest.ApplyRoles
	asUser             = dbtest.AsUser
	dropRole           = dbtest.DropRole
	execAtEnd          = dbtest.ExecAtEnd
	failureLeases      = dbtest.FailureLeases
	freshURL           = dbtest.DatabaseURL
	grantedRole        = dbtest.GrantedRole
	isArgErr           = dbtest.IsArgErr
	isPermissionDenied = dbtest.IsPermissionDenied
	loginRole          = dbtest.LoginRole
	newPool            = dbtest.OpenPool
	openStore          = dbtest.OpenStore
	queuesBoth         = dbtest.Queues
	rolesMu            = &dbtest.RolesMu
	rolesSQL           = dbtest.RolesSQL
	tableDigest        = dbtest.TableDigest
	tableOf            = dbtest.TableOf
	waitForLockWait    = dbtest.WaitForLockWait
)

// pick returns short in the always-on form and long under -stress.
func pick[T any](short, long T) T { return dbtest.Pick(short, long) }
