//go:build !unix

package main

import "syscall"

// serverProcAttr returns no special attributes: outside Unix the server
// programs run as the current user in leasectl's process group.
func serverProcAttr(string) (*syscall.SysProcAttr, error) { return nil, nil }
