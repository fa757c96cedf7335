package redistest

import "syscall"

// sysProcAttr kills redis-server when the test process dies, so a crashed test leaves nothing behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
