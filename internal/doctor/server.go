package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
)

// maxNaptime is the longest autovacuum_naptime doctor accepts without a
// warning.
const maxNaptime = 10 * time.Second

// checkServer reads the server's autovacuum settings and what holds back
// VACUUM in this database (the oldest snapshot, prepared transactions,
// replication slots) into rep, and reports each as a problem or warning.
func checkServer(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	g := gen.New()
	n := notes{&rep.Problems, &rep.Warnings}
	settings, err := g.DiagnosticsSettings(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: settings: %w", err)
	}
	set := map[string]string{}
	for _, s := range settings {
		set[s.Name] = s.Setting
	}
	rep.Autovacuum = set["autovacuum"] == "on"
	if naptime, err := time.ParseDuration(set["autovacuum_naptime"] + "s"); err == nil {
		rep.AutovacuumNaptimeSeconds = naptime.Seconds()
	}
	if !rep.Autovacuum {
		n.problem(msgAutovacuumOffServer)
	}
	if set["track_counts"] == "off" {
		n.problem(msgTrackCountsOff)
	}
	if rep.Autovacuum && rep.AutovacuumNaptimeSeconds > maxNaptime.Seconds() {
		n.warn(msgNaptime, time.Duration(rep.AutovacuumNaptimeSeconds*float64(time.Second)), maxNaptime)
	}

	xacts, err := g.DiagnosticsOldestXact(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: oldest transaction: %w", err)
	}
	if len(xacts) > 0 {
		x := xacts[0]
		rep.OldestXactSeconds, rep.OldestXactPID = x.XactAge.Seconds(), x.Pid
		rep.OldestXactState, rep.OldestXactApplication = x.State, x.ApplicationName
		if x.XactAge > opts.MaxXactAge {
			n.problem(msgOldSnapshot, x.Pid, x.State, x.ApplicationName, round(x.XactAge), opts.MaxXactAge)
		}
	}
	prepared, err := g.DiagnosticsPreparedXacts(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: prepared transactions: %w", err)
	}
	rep.PreparedXacts, rep.OldestPreparedSeconds = prepared.Prepared, prepared.OldestAge.Seconds()
	if prepared.Prepared > 0 && prepared.OldestAge > opts.MaxXactAge {
		n.problem(msgOldPrepared, prepared.Prepared, round(prepared.OldestAge))
	}
	slots, err := g.DiagnosticsReplicationSlots(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: replication slots: %w", err)
	}
	for _, s := range slots {
		if s.Active {
			n.warn(msgSlot, s.SlotName, s.XminAge)
		} else {
			n.problem(msgSlotInactive, s.SlotName, s.XminAge)
		}
	}
	return nil
}
