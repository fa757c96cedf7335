package gateway

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

// command builds the stdio server's process with a clean environment.
func (u *upstream) command(ctx context.Context, command string, _ []string, args []string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, command, args...)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range u.cfg.Env {
		env = append(env, k+"="+v)
	}
	for k, name := range u.cfg.CredentialEnv {
		v, ok := u.creds.Get(name)
		if !ok {
			return nil, fmt.Errorf("credential %q for %s is not available", name, k)
		}
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.Stderr = nil
	// A process group of its own: Ctrl-C at a terminal signals the whole foreground group, and
	// a server that died of it before serve had drained was reported lost and started again
	// during the shutdown. Serve stops it itself, last.
	cmd.SysProcAttr = ownProcessGroup()
	return cmd, nil
}
