package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/plural"
)

// maxRolesShown is how many roles a warning names.
const maxRolesShown = 10

// checkSignal reads the queue's work signal into qr (none before
// migration 00009) and, once the insert trigger reads the sequence
// (migration 00014), warns of the roles that may insert but not read it.
func checkSignal(ctx context.Context, pool *pgxpool.Pool, qr *QueueReport, n notes) error {
	signal, err := gen.New().DiagnosticsWorkSignalAccess(ctx, pool, gen.DiagnosticsWorkSignalAccessParams{TableName: qr.Table})
	if err != nil {
		return fmt.Errorf("doctor: %s work signal: %w", qr.Table, err)
	}
	if !signal.Present {
		return nil
	}
	qr.Signal = &SignalState{Sequence: signal.SequenceName, Gated: signal.Gated, MaySelect: signal.Selectable,
		RolesWithoutSelect: signal.RolesWithoutSelect}
	roles := signal.RolesWithoutSelect
	if !signal.Gated || len(roles) == 0 {
		return nil
	}
	shown := roles[:min(len(roles), maxRolesShown)]
	more := ""
	if hidden := len(roles) - len(shown); hidden > 0 {
		more = fmt.Sprintf(msgMoreRoles, plural.Count(hidden, "role", "roles"))
	}
	n.warn(msgSignalNotReadable, plural.Count(len(roles), "role", "roles"), strings.Join(shown, ", "), more, qr.Table, qr.Signal.Sequence)
	return nil
}
