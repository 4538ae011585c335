package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/leasestore/leasestore/db"
)

// libraryModule is the module of the library leasectl is built with.
const libraryModule = "github.com/leasestore/leasestore"

// printVersion prints leasectl's module version, the library's, and the
// newest migration the binary applies (the schema level it needs).
func printVersion(w io.Writer) error {
	mainVersion, libVersion := "(unknown)", "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		mainVersion = bi.Main.Version
		for _, d := range bi.Deps {
			if d.Path == libraryModule {
				libVersion = d.Version
				if d.Replace != nil {
					libVersion = d.Replace.Path + " " + d.Replace.Version
				}
			}
		}
	}
	reqs, err := db.Requirements()
	if err != nil {
		return err
	}
	last := reqs[len(reqs)-1]
	_, err = fmt.Fprintf(w, "leasectl %s\nlibrary %s %s\nmigrations %d (newest %s)\n", mainVersion, libraryModule, libVersion, last.Version, last.Name)
	return err
}
