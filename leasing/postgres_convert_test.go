package leasing

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
)

func TestIDTexts(t *testing.T) {
	t.Parallel()
	ids := []uuid.UUID{uuid.New(), uuid.Nil, uuid.Max, uuid.MustParse("0191f7d2-7b4e-7c3a-9d1e-2f3a4b5c6d7e")}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	require.Equal(t, want, idTexts(ids))
	require.Equal(t, []string{}, idTexts(nil), "never nil: an empty array, not NULL")
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	ids := []uuid.UUID{a, b, c}
	require.Equal(t, []MessageOutcome{{a, OutcomeApplied}, {b, OutcomeApplied}, {c, OutcomeApplied}},
		outcomes(ids, []*gen.InboxCompleteRow{}), "no row: every message applied")
	require.Equal(t, []MessageOutcome{{a, OutcomeApplied}, {b, OutcomeNotFound}, {c, OutcomeLost}},
		outcomes(ids, []*gen.InboxCompleteRow{{MessageID: c, Outcome: "lost"}, {MessageID: b, Outcome: "not_found"}}),
		"rows in any order, outcomes in the ids' order")
	require.Equal(t, []MessageOutcome{}, outcomes(nil, nil))
}

func TestMapErrLockTimeout(t *testing.T) {
	t.Parallel()
	server := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	err := mapErr(fmt.Errorf("batch: %w", server))
	require.ErrorIs(t, err, ErrLockTimeout)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's error stays in the chain")
	require.Equal(t, "55P03", pgErr.Code)
	require.Equal(t, err, mapErr(err), "mapping twice changes nothing")
	require.NotErrorIs(t, mapErr(&pgconn.PgError{Code: "40001"}), ErrLockTimeout)
}

func TestMapErrPermissionDenied(t *testing.T) {
	t.Parallel()
	server := &pgconn.PgError{Code: "42501", Message: "permission denied for table inbox_ordering_keys"}
	err := mapErr(fmt.Errorf("complete: %w", server))
	require.ErrorIs(t, err, ErrPermissionDenied)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	require.Equal(t, err, mapErr(err), "mapped once")
	require.NotErrorIs(t, mapErr(&pgconn.PgError{Code: "42P01"}), ErrPermissionDenied)
}

func TestLockTimeoutSetting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   time.Duration
		want string
	}{
		{0, "5000ms"},
		{time.Millisecond, "1ms"},
		{1500 * time.Microsecond, "1ms"},
		{2 * time.Second, "2000ms"},
		{MaxLockTimeout, "2147483647ms"},
	} {
		got, err := lockTimeoutSetting(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
	for _, bad := range []time.Duration{-time.Millisecond, -1, time.Microsecond, MaxLockTimeout + time.Millisecond} {
		_, err := lockTimeoutSetting(bad)
		require.ErrorIs(t, err, ErrInvalidArgument, bad)
		var ae *ArgumentError
		require.ErrorAs(t, err, &ae)
		require.Equal(t, "lock timeout", ae.Field)
	}
}
