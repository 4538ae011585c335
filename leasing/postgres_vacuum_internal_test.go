package leasing

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
)

// TestVacuumDue: a table is vacuumed at the dead-row threshold unless a
// VACUUM of it runs; the ordering keys' table also once it holds rows that
// were never analysed.
func TestVacuumDue(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		st      gen.VacuumStateRow
		analyse bool
		want    bool
	}{
		"BelowThreshold":           {gen.VacuumStateRow{DeadRows: 99, Analyzed: true}, false, false},
		"AtThreshold":              {gen.VacuumStateRow{DeadRows: 100}, false, true},
		"AtThresholdButRunning":    {gen.VacuumStateRow{DeadRows: 100, Running: true}, true, false},
		"QueueTableNeverAnalysed":  {gen.VacuumStateRow{LiveRows: 10}, false, false},
		"KeysNeverAnalysed":        {gen.VacuumStateRow{LiveRows: 10}, true, true},
		"KeysNeverAnalysedRunning": {gen.VacuumStateRow{LiveRows: 10, Running: true}, true, false},
		"KeysEmptyNeverAnalysed":   {gen.VacuumStateRow{}, true, false},
		"KeysAnalysedBelow":        {gen.VacuumStateRow{DeadRows: 99, LiveRows: 10, Analyzed: true}, true, false},
		"KeysAtThreshold":          {gen.VacuumStateRow{DeadRows: 100, Analyzed: true}, true, true},
	} {
		require.Equal(t, c.want, vacuumDue(&c.st, 100, c.analyse), name)
	}
}
