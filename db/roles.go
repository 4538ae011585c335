package db

import _ "embed"

//go:embed roles.sql
var roles string

// Roles returns db/roles.sql: the least-privilege roles leasestore_processor
// and leasestore_operator and their grants, one idempotent transaction to
// run (as the tables' owner or a superuser, with the simple protocol: it
// holds several statements) after every migration. leasectl migrate roles
// runs it.
func Roles() string { return roles }
