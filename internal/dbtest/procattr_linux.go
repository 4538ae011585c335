package dbtest

import "syscall"

// pgbouncerProcAttr runs PgBouncer with cred (nil: as this process) and
// has the kernel stop it when this process dies before Main stopped it.
func pgbouncerProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM}
}
