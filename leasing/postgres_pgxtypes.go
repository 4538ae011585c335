package leasing

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// RegisterTypes teaches conn's type map to send and read github.com/google/uuid
// values as binary PostgreSQL uuid. Without it pgx goes through the
// database/sql methods of uuid.UUID: every id a query returns (one per
// claimed or written message) is formatted as a string and parsed back.
// Stores work the same either way, in every pgx query mode: the queue
// queries take their arrays of ids as text[], which pgx encodes without
// any registration. Use it as (or call it from) pgxpool.Config.AfterConnect:
//
//	cfg.AfterConnect = leasing.RegisterTypes
//
// It never fails.
func RegisterTypes(_ context.Context, conn *pgx.Conn) error {
	registerUUID(conn.TypeMap())
	return nil
}

func registerUUID(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUIDEncodePlan}, m.TryWrapEncodePlanFuncs...)
	m.RegisterType(&pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}})
}

// pgUUID is a uuid.UUID that pgtype's UUIDCodec encodes and decodes directly.
type pgUUID uuid.UUID

func (u pgUUID) UUIDValue() (pgtype.UUID, error) {
	return pgtype.UUID{Bytes: [16]byte(u), Valid: true}, nil
}

type wrapUUIDEncodePlan struct{ next pgtype.EncodePlan }

func (p *wrapUUIDEncodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *wrapUUIDEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(pgUUID(value.(uuid.UUID)), buf)
}

func tryWrapUUIDEncodePlan(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := value.(uuid.UUID); ok {
		return &wrapUUIDEncodePlan{}, pgUUID(u), true
	}
	return nil, nil, false
}

// uuidCodec is pgtype.UUIDCodec that also scans into *uuid.UUID directly.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if format == pgtype.BinaryFormatCode {
		switch target.(type) {
		case *uuid.UUID:
			return scanUUID{}
		}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

type scanUUID struct{}

func (scanUUID) Scan(src []byte, dst any) error {
	if src == nil {
		return fmt.Errorf("cannot scan NULL into *uuid.UUID")
	}
	if len(src) != 16 {
		return fmt.Errorf("invalid length for uuid: %d bytes", len(src))
	}
	copy(dst.(*uuid.UUID)[:], src)
	return nil
}
