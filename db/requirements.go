package db

import (
	"cmp"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/pressly/goose/v3"
)

// Requirement is one embedded migration and what the code needs of it: its
// version applied, as VersionTable records it, and the indexes its Up part
// creates valid, unless a later migration drops them. Every embedded
// migration is required, so code newer than a database's schema finds the
// migrations it adds missing; a database migrated further than the code
// knows (a newer version's migrations) meets every requirement.
type Requirement struct {
	// Version is the goose version, e.g. 5.
	Version int64
	// Name is the migration's file name without ".sql", e.g.
	// "00005_lease_expiry_idx".
	Name string
	// Indexes are the indexes the migration creates that the schema must
	// still hold, in file order, each with its table. A table's PRIMARY
	// KEY counts as the index <table>_pkey.
	Indexes []RequiredIndex
}

// RequiredIndex is one index the statements rely on.
type RequiredIndex struct {
	// Name is the index name, e.g. "inbox_messages_ready_idx".
	Name string
	// Table is the table it indexes, e.g. "inbox_messages".
	Table string
}

// The patterns Requirements reads the Up part of each migration with, after
// comments are removed. Index and table names in the migrations are plain
// lower-case identifiers, never quoted or schema-qualified.
var (
	createIndexRE = regexp.MustCompile(`(?is)\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\s+ON\s+(?:ONLY\s+)?([a-z_][a-z0-9_]*)`)
	createTableRE = regexp.MustCompile(`(?is)\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\s*\(`)
	primaryKeyRE  = regexp.MustCompile(`(?i)\bPRIMARY\s+KEY\b`)
	dropIndexRE   = regexp.MustCompile(`(?is)\bDROP\s+INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_,\s]*)`)
	lineComment   = regexp.MustCompile(`--[^\n]*`)
)

// Requirements returns what the code needs of a database's schema, one
// Requirement per embedded migration, ordered by version: the one list
// that leasing's schema check and leasectl doctor compare a database with.
//
// Errors: a migration file whose name has no version (a build defect).
func Requirements() ([]Requirement, error) {
	files, err := fs.Glob(Migrations(), "*.sql")
	if err != nil {
		return nil, err
	}
	reqs := make([]Requirement, 0, len(files))
	dropped := map[int64][]string{}
	for _, f := range files {
		v, err := goose.NumericComponent(f)
		if err != nil {
			return nil, fmt.Errorf("db: migration %s: %w", f, err)
		}
		text, err := fs.ReadFile(Migrations(), f)
		if err != nil {
			return nil, err
		}
		up := upPart(string(text))
		reqs = append(reqs, Requirement{Version: v, Name: strings.TrimSuffix(path.Base(f), ".sql"), Indexes: createdIndexes(up)})
		dropped[v] = droppedIndexes(up)
	}
	slices.SortFunc(reqs, func(a, b Requirement) int { return cmp.Compare(a.Version, b.Version) })
	// An index a later migration drops is no longer required.
	for i, r := range reqs {
		for _, name := range dropped[r.Version] {
			for j := range reqs[:i] {
				reqs[j].Indexes = slices.DeleteFunc(reqs[j].Indexes, func(ix RequiredIndex) bool { return ix.Name == name })
			}
		}
	}
	return reqs, nil
}

// upPart returns the statements between "-- +goose Up" and "-- +goose
// Down" (or the end), without comments.
func upPart(text string) string {
	if _, after, ok := strings.Cut(text, "-- +goose Up"); ok {
		text = after
	}
	text, _, _ = strings.Cut(text, "-- +goose Down")
	return lineComment.ReplaceAllString(text, "")
}

func createdIndexes(up string) []RequiredIndex {
	var out []RequiredIndex
	for _, stmt := range strings.Split(up, ";") {
		if m := createTableRE.FindStringSubmatch(stmt); m != nil && primaryKeyRE.MatchString(stmt) {
			out = append(out, RequiredIndex{Name: m[1] + "_pkey", Table: m[1]})
		}
		for _, m := range createIndexRE.FindAllStringSubmatch(stmt, -1) {
			out = append(out, RequiredIndex{Name: m[1], Table: m[2]})
		}
	}
	return out
}

func droppedIndexes(up string) []string {
	var out []string
	for _, m := range dropIndexRE.FindAllStringSubmatch(up, -1) {
		for _, name := range strings.Split(m[1], ",") {
			if name = strings.TrimSpace(name); name != "" {
				out = append(out, strings.Fields(name)[0])
			}
		}
	}
	return out
}
