//go:build !unix

package gateway

import "syscall"

// ownProcessGroup: no process groups here; the server shares the console's signals.
func ownProcessGroup() *syscall.SysProcAttr { return nil }
