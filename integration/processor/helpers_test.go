package processor_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn          = dbtest.AdminConn
	applyRoles         = dbtest.ApplyRoles
	asUser             = dbtest.AsUser
	freshURL           = dbtest.DatabaseURL
	grantedRole        = dbtest.GrantedRole
	isPermissionDenied = dbtest.IsPermissionDenied
	loginRole          = dbtest.LoginRole
	newPool            = dbtest.OpenPool
	openStore          = dbtest.OpenStore
	queuesBoth         = dbtest.Queues
	tableDigest        = dbtest.TableDigest
	tableOf            = dbtest.TableOf
)
