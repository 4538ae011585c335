package doctor

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/leasing"
)

// schemaErrors are the SQLSTATEs of a statement that the schema does not
// fit: undefined_table, undefined_column, undefined_function.
var schemaErrors = []string{"42P01", "42703", "42883"}

// checkPrivileges runs store.CheckPrivileges, the check every processor
// runs before its first claim, and reports a refused call as a problem,
// and a statement the schema does not fit as a warning when behind (the
// migrations the statements need are not applied) or else as a problem,
// as it does any other error the server returned for a statement. It
// reports whether the checks that need the processors' privileges may be
// made. Errors: ErrLockTimeout (DDL holds a table), the connection's and
// the context's.
func checkPrivileges(ctx context.Context, store *leasing.Postgres, behind bool, n notes) (bool, error) {
	err := store.CheckPrivileges(ctx)
	var (
		pe    *leasing.PrivilegeError
		pgErr *pgconn.PgError
	)
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pe):
		refused := make([]string, len(pe.Refused))
		for i, r := range pe.Refused {
			refused[i] = r.String()
		}
		n.problem(msgPrivilegesRefused, strings.Join(refused, ", "))
		return false, nil
	case errors.Is(err, leasing.ErrLockTimeout), !errors.As(err, &pgErr):
		return false, err
	case slices.Contains(schemaErrors, pgErr.Code) && behind:
		n.warn(msgPrivilegesNotYet, pgErr.Message)
		return true, nil
	case slices.Contains(schemaErrors, pgErr.Code):
		n.problem(msgStatementsUnfit, pgErr.Error())
		return false, nil
	}
	n.problem(msgStatementsFail, pgErr.Error())
	return false, nil
}
