//go:build unix

package gateway

import "syscall"

// ownProcessGroup starts a stdio upstream in a process group of its own (see command).
func ownProcessGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
