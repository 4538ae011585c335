package leasing

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

func TestRegisterUUID(t *testing.T) {
	t.Parallel()
	plain, m := pgtype.NewMap(), pgtype.NewMap()
	registerUUID(m)
	id := uuid.MustParse("0191f7d2-7b4e-7c3a-9d1e-2f3a4b5c6d7e")
	ids := []uuid.UUID{id, uuid.Nil, uuid.MustParse("ffffffff-0000-4000-8000-000000000001")}

	for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
		want, err := plain.Encode(pgtype.UUIDOID, format, id, nil)
		require.NoError(t, err)
		got, err := m.Encode(pgtype.UUIDOID, format, id, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "format %d", format)

		arrOID := uint32(pgtype.UUIDArrayOID)
		want, err = plain.Encode(arrOID, format, ids, nil)
		require.NoError(t, err)
		got, err = m.Encode(arrOID, format, ids, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "array, format %d", format)
	}

	var nilID *uuid.UUID
	got, err := m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, nilID, nil)
	require.NoError(t, err)
	require.Nil(t, got, "a nil *uuid.UUID is NULL")

	var back uuid.UUID
	require.NoError(t, m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, id[:], &back))
	require.Equal(t, id, back)
	require.NoError(t, m.Scan(pgtype.UUIDOID, pgtype.TextFormatCode, []byte(id.String()), &back))
	require.Equal(t, id, back)
	var ptr *uuid.UUID
	require.NoError(t, m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, id[:], &ptr))
	require.Equal(t, id, *ptr)
	require.NoError(t, m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, nil, &ptr))
	require.Nil(t, ptr)
	require.Error(t, m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, nil, &back))
}

// TestRegisterUUIDSkipsValuer checks that registered ids are encoded
// without the database/sql detour: far fewer allocations per array.
func TestRegisterUUIDSkipsValuer(t *testing.T) {
	plain, m := pgtype.NewMap(), pgtype.NewMap()
	registerUUID(m)
	ids := make([]uuid.UUID, 100)
	for i := range ids {
		ids[i] = uuid.New()
	}
	allocs := func(m *pgtype.Map) float64 {
		buf := make([]byte, 0, 4096)
		return testing.AllocsPerRun(20, func() {
			if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf[:0]); err != nil {
				t.Fatal(err)
			}
		})
	}
	slow, fast := allocs(plain), allocs(m)
	t.Logf("allocations to encode 100 ids: %.0f plain, %.0f registered", slow, fast)
	require.Less(t, fast, slow/5)
}
