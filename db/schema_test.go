package db_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite testdata/schema.golden from the migrated schema")

// schemaGolden is the migrated schema as schemaCatalogSQL describes it.
var schemaGolden = filepath.Join("testdata", "schema.golden")

// schemaCatalogSQL describes the public schema one line per object, in a
// stable order: tables, columns (type, default, nullability), constraints,
// indexes (definition, validity), triggers and functions. goose's own
// version tables (the old goose_db_version, our leasestore_db_version) are
// left out: they record which migrations ran, not what they built.
const schemaCatalogSQL = `
SELECT line FROM (
    SELECT 1 AS kind, c.relname::text AS k1, '' AS k2,
           'table ' || c.relname AS line
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname NOT IN ('goose_db_version', 'leasestore_db_version')
  UNION ALL
    SELECT 2, c.relname::text, lpad(a.attnum::text, 4, '0'),
           'column ' || c.relname || '.' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE ' NULL' END
           || coalesce(' DEFAULT ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
           || coalesce(' COMMENT ' || quote_literal(pg_catalog.col_description(c.oid, a.attnum)), '')
    FROM pg_catalog.pg_attribute AS a
    JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname NOT IN ('goose_db_version', 'leasestore_db_version')
      AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT 3, c.relname::text, co.conname::text,
           'constraint ' || c.relname || '.' || co.conname || ' ' || pg_catalog.pg_get_constraintdef(co.oid)
    FROM pg_catalog.pg_constraint AS co
    JOIN pg_catalog.pg_class AS c ON c.oid = co.conrelid
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relname NOT IN ('goose_db_version', 'leasestore_db_version')
      AND co.contype <> 'n' -- NOT NULL (catalogued from PostgreSQL 18): in the column lines
  UNION ALL
    SELECT 4, t.relname::text, ic.relname::text,
           'index ' || ic.relname || ' ' || pg_catalog.pg_get_indexdef(i.indexrelid)
           || CASE WHEN i.indisvalid THEN ' VALID' ELSE ' INVALID' END
           || CASE WHEN i.indisready THEN ' READY' ELSE ' NOT READY' END
    FROM pg_catalog.pg_index AS i
    JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid
    JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
    WHERE n.nspname = 'public' AND t.relname NOT IN ('goose_db_version', 'leasestore_db_version')
  UNION ALL
    SELECT 5, c.relname::text, tg.tgname::text,
           'trigger ' || tg.tgname || ' ' || pg_catalog.pg_get_triggerdef(tg.oid)
           || CASE tg.tgenabled WHEN 'D' THEN ' DISABLED' ELSE '' END
    FROM pg_catalog.pg_trigger AS tg
    JOIN pg_catalog.pg_class AS c ON c.oid = tg.tgrelid
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND NOT tg.tgisinternal
  UNION ALL
    SELECT 6, p.proname::text, pg_catalog.pg_get_function_identity_arguments(p.oid),
           'function ' || replace(pg_catalog.pg_get_functiondef(p.oid), E'\n', E'\n    ')
    FROM pg_catalog.pg_proc AS p
    JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public'
) AS s
ORDER BY kind, k1, k2`

// TestMigratedSchema migrates a fresh database and compares its schema with
// testdata/schema.golden, written from the migrations before the queries
// were rendered from templates: existing migrations keep their effect.
// Regenerate it deliberately, after a new migration, with
// go test ./db -run TestMigratedSchema -update-schema.
func TestMigratedSchema(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	rows, err := pool.Query(t.Context(), schemaCatalogSQL)
	require.NoError(t, err)
	var b strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		b.WriteString(line)
		b.WriteByte('\n')
	}
	require.NoError(t, rows.Err())
	got := b.String()
	if *updateSchema {
		require.NoError(t, os.WriteFile(schemaGolden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(schemaGolden)
	require.NoError(t, err)
	require.Equal(t, string(want), got, "migrated schema differs from %s", schemaGolden)
}
