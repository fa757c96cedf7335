package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is a peer or Sandgate running as its own OS process, started and stopped by the bench.
type process struct {
	name  string
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
	meter *cpuMeter
}

// runCgroups are the per-process cgroups of this run (see cpumeter.go): Run sets them before
// it starts anything and removes them at the end. A run is one per sandbench process.
var runCgroups *cgroups

// PID is the process whose CPU and memory the report shows.
func (p *process) PID() int { return p.cmd.Process.Pid }

// startProcess runs bin with args in the foreground of its own process group, its output
// going to dir/NAME.log.
func startProcess(name, dir string, env []string, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	pid := cmd.Process.Pid
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{}),
		meter: &cpuMeter{pgid: pid, groups: runCgroups, cgroup: runCgroups.attach(name, pid)}}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Stop sends SIGTERM to the process group and SIGKILL after grace.
func (p *process) Stop(grace time.Duration) {
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
	}
}

// exited reports an early exit with the tail of its log.
func (p *process) exited() error {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		return fmt.Errorf("%s exited: %s", p.name, b)
	default:
		return nil
	}
}

// waitTCP waits until addr accepts connections, or the process exits, or timeout.
func (p *process) waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := p.exited(); err != nil {
			return err
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not accepting after %s (log %s)", p.name, addr, timeout, p.log)
}

// waitHTTP waits until url answers 200.
func (p *process) waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if err := p.exited(); err != nil {
			return err
		}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not ready after %s (log %s)", p.name, url, timeout, p.log)
}

// freePort returns a loopback port nothing listens on right now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// raiseFileLimit lifts RLIMIT_NOFILE to n (root may raise the hard limit too); children inherit it.
// Where the hard limit cannot be raised it lifts the soft limit to the hard one and says so: the
// loadgen holds one descriptor per sandbox connection (the stand-ins hold the other end in
// their own process, see ServeUpstreams).
func raiseFileLimit(n uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	if l.Cur >= n {
		return nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(n, l.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		want = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err2 != nil {
			return errors.Join(fmt.Errorf("setrlimit: %w", err), err2)
		}
		return fmt.Errorf("open-file limit is %d, not %d (%v); cells of more than %d connections (a sandbox holds one, four in the mix) may fail to connect some of them",
			want.Cur, n, err, want.Cur-1000)
	}
	return nil
}
