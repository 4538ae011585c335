package db

import (
	"context"
	_ "embed"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed roles.sql
var roles string

// Roles returns db/roles.sql: the least-privilege roles leasestore_processor
// and leasestore_operator and their grants, one idempotent transaction to
// run (as the tables' owner or a superuser, with the simple protocol: it
// holds several statements) after every migration. leasectl migrate roles
// runs it.
func Roles() string { return roles }

// ApplyRoles runs Roles on pool's database in one transaction (the file's
// own), as the tables' owner or a superuser.
//
// Errors: the server's, e.g. permission denied for a role that may not
// create roles or grant on the tables; nothing changed then.
func ApplyRoles(ctx context.Context, pool *pgxpool.Pool) error {
	// No arguments: the simple protocol, which runs the file's statements.
	_, err := pool.Exec(ctx, roles)
	return err
}
