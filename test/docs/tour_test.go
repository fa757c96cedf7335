package docs

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tour is `make run` in a copy of the repository.
type tour struct {
	root   string            // the copy: tracked and untracked-but-not-ignored files of this checkout
	src    string            // this checkout
	ports  map[string]string // the example's fixed addresses → free ones
	log    *syncBuffer       // make run's output (make, model-api, sandgate serve)
	run    *exec.Cmd         // make run
	exited chan struct{}     // closed when make run has exited
}

// The addresses examples/sandgate.yaml and the Makefile fix, moved to free ports so that the
// test runs beside a developer's own `make run`.
var fixedAddrs = []string{"127.0.0.1:8080", "127.0.0.1:3128", "127.0.0.1:9090", "127.0.0.1:8443"}

// startTour copies the repository and runs `make run` there, build included, as a new user
// would after cloning, until the test ends. The copy has no .tools: what the docs run needs
// nothing `make setup` installs.
func startTour(t *testing.T) *tour {
	src, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	tr := &tour{root: t.TempDir(), src: src, ports: map[string]string{}, log: &syncBuffer{}}
	copyCheckout(t, src, tr.root)

	for _, a := range fixedAddrs {
		tr.ports[a] = freeAddr(t)
	}
	cfgPath := filepath.Join(tr.root, "examples", "sandgate.yaml")
	cfg, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfgPath, []byte(tr.onFreePorts(string(cfg))+"shutdown: {delay: 0s}\n"), 0o644))

	run := exec.Command("make", "run", "MODEL_API="+tr.ports["127.0.0.1:8443"])
	run.Dir, run.Env = tr.root, tr.env()
	run.Stdout, run.Stderr = tr.log, tr.log
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground job: Ctrl-C signals the group
	require.NoError(t, run.Start())
	tr.run, tr.exited = run, make(chan struct{})
	go func() { _ = run.Wait(); close(tr.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-run.Process.Pid, syscall.SIGTERM)
		select {
		case <-tr.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
			<-tr.exited
		}
	})
	tr.waitReady(t, tr.exited)
	return tr
}

// readyLine is what serve logs once when it is ready, on the tour's ports.
func (tr *tour) readyLine() string {
	return tr.onFreePorts(`msg="ready: MCP at http://127.0.0.1:8080/mcp, proxy at 127.0.0.1:3128, admin at http://127.0.0.1:9090"`)
}

// waitReady waits for Sandgate's /readyz, its ready line and the stand-in's port, or for make
// run to fail. A first build in the copy compiles Sandgate's own packages again (their folder
// is part of what the build cache keys them by).
func (tr *tour) waitReady(t *testing.T, exited <-chan struct{}) {
	deadline := time.Now().Add(15 * time.Minute)
	for {
		resp, err := http.Get("http://" + tr.ports["127.0.0.1:9090"] + "/readyz")
		ready := err == nil && resp.StatusCode == http.StatusOK
		if err == nil {
			resp.Body.Close()
		}
		if ready && strings.Contains(tr.log.String(), tr.readyLine()) {
			if c, err := net.Dial("tcp", tr.ports["127.0.0.1:8443"]); err == nil {
				c.Close()
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("make run exited before it was ready:\n%s", tr.log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("make run not ready within 15 minutes:\n%s", tr.log)
		}
	}
}

// onFreePorts rewrites the example's fixed addresses to the tour's.
func (tr *tour) onFreePorts(s string) string {
	for from, to := range tr.ports {
		s = strings.ReplaceAll(s, from, to)
	}
	return s
}

// env is a plain shell's environment: the PATH without the tools folder `make test` puts on it.
func (tr *tour) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "PATH":
			kv = "PATH=" + plainPath(value)
		case "MAKEFLAGS", "MAKELEVEL", "MFLAGS":
			continue // make test's own make; the tour's make is a fresh one, as in a shell
		}
		env = append(env, kv)
	}
	return env
}

func plainPath(path string) string {
	var keep []string
	for _, dir := range filepath.SplitList(path) {
		if filepath.Base(dir) == "bin" && filepath.Base(filepath.Dir(dir)) == ".tools" {
			continue
		}
		keep = append(keep, dir)
	}
	return strings.Join(keep, string(filepath.ListSeparator))
}

// copyCheckout copies the files git knows of (tracked, and untracked but not ignored: a doc being
// written is run too) from src to dst.
func copyCheckout(t *testing.T, src, dst string) {
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = src
	out, err := ls.Output()
	require.NoError(t, err, "git ls-files: the docs test copies the checkout git describes")
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		from := filepath.Join(src, rel)
		st, err := os.Lstat(from)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		require.NoError(t, err)
		to := filepath.Join(dst, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(from)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(target, to))
			continue
		}
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, b, st.Mode().Perm()))
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
