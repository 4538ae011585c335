//go:build !linux && !windows

package dbtest

import "syscall"

// pgbouncerProcAttr runs PgBouncer with cred (nil: as this process).
func pgbouncerProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
