package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// startTimeout bounds how long a start or restart may take to answer PING. Generous: test machines
// are often heavily loaded.
const startTimeout = 20 * time.Second

// Server is one redis-server process owned by a test.
type Server struct {
	// Addr is "127.0.0.1:PORT"; it stays the same across Restart.
	Addr string

	t    testing.TB
	bin  string
	dir  string
	port int
	// args are added to the command line (cluster mode, TLS); tls, when set, is how PING reaches
	// the server.
	args []string
	tls  *tls.Config

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
	// conf, when set, is a config file given first on the command line with --sentinel: the
	// server runs as a sentinel.
	conf string
}

// Start launches redis-server on a free loopback port and waits until it answers PING. The server
// is killed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return startServer(t, "redis-server", nil, nil)
}

// startServer runs bin (redis-server, or redis-sentinel's equivalent) with args added.
func startServer(t testing.TB, name string, args []string, tlsConf *tls.Config) *Server {
	t.Helper()
	s := newServer(t, name)
	s.args, s.tls = args, tlsConf
	t.Cleanup(s.kill)
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// newServer finds the binary and a free port; the process is not started.
func newServer(t testing.TB, name string) *Server {
	t.Helper()
	bin := tool(t, name)
	port, err := freePort()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		t:    t,
		bin:  bin,
		dir:  t.TempDir(),
		port: port,
	}
}

// tool finds redis-server or redis-cli ($SANDGATE_REDIS_SERVER names redis-server), or skips the
// test (fails it when $SANDGATE_REQUIRE_TOOLS is set).
func tool(t testing.TB, name string) string {
	t.Helper()
	if bin := os.Getenv("SANDGATE_REDIS_SERVER"); bin != "" && name == "redis-server" {
		return bin
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		msg := name + " not found on PATH (install it with test/setup.sh or apt-get install redis-server, or set SANDGATE_REDIS_SERVER)"
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// Client returns a go-redis client for the server with short timeouts, closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DisableIdentity:       true,
		Protocol:              2,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server; connections to Addr are refused until Restart. Data is lost (no
// persistence), as after a failover to an empty replica.
func (s *Server) Stop() {
	s.t.Helper()
	s.kill()
}

// Restart starts the server again on the same port after Stop.
func (s *Server) Restart() {
	s.t.Helper()
	s.kill()
	deadline := time.Now().Add(startTimeout)
	for {
		err := s.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: restart on %s: %v", s.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause freezes the server (SIGSTOP): connections are accepted by the kernel but nothing is
// answered, the way a hung or partitioned server behaves. Resume undoes it; the test's cleanup
// resumes a paused server before killing it.
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP, true)
}

// Resume continues a paused server.
func (s *Server) Resume() {
	s.t.Helper()
	s.signal(syscall.SIGCONT, false)
}

func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %s is not running", s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %s: %v", sig, err)
	}
	s.paused = paused
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logFile, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	port := []string{"--port", strconv.Itoa(s.port)}
	if s.tls != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}
	}
	args := append([]string{"--bind", "127.0.0.1"}, port...)
	if s.conf != "" {
		args = append([]string{s.conf, "--sentinel"}, args...)
		args = append(args, "--dir", s.dir, "--daemonize", "no")
	} else {
		args = append(args, "--save", "", "--appendonly", "no", "--dir", s.dir,
			"--protected-mode", "yes", "--daemonize", "no")
	}
	cmd := exec.Command(s.bin, append(args, s.args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited, s.paused = cmd, exited, false

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		if err := ping(ctx, s.Addr, s.tls); err == nil {
			return nil
		}
		select {
		case <-exited:
			s.cmd = nil
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited during start; log:\n%s", s.Addr, tail(string(log), 2000))
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s did not answer PING within %s", s.Addr, startTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // SIGKILL works on a stopped process too
	<-s.exited
	s.cmd, s.paused = nil, false
}

// ping sends an inline PING and expects +PONG, over TLS when tlsConf is set.
func ping(ctx context.Context, addr string, tlsConf *tls.Config) error {
	var d net.Dialer
	var conn net.Conn
	var err error
	if tlsConf != nil {
		conn, err = (&tls.Dialer{NetDialer: &d, Config: tlsConf}).DialContext(ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
