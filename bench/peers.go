package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandgate/sandgate/proxy"
)

// Skip is a target a run left out, and why: a peer that is not installed (make setup installs
// them; the bench installs nothing, so it runs offline), or that did not start.
type Skip struct {
	Target string `json:"target"`
	Why    string `json:"why"`
}

// onPath is a peer's check for a command installed on PATH.
func onPath(command string) func() string {
	return func() string {
		if _, err := exec.LookPath(command); err != nil {
			return "not installed (" + command + " is not on PATH): make setup installs it"
		}
		return ""
	}
}

// builtBy is a peer's check for a binary at path, which how builds.
func builtBy(path, how string) func() string {
	return func() string {
		if _, err := os.Stat(path); err != nil {
			return "not built (" + path + "): " + how
		}
		return ""
	}
}

// Target is one way of reaching the upstreams: direct (no proxy), or through a proxy process.
type Target struct {
	Name        string
	Proxy       string // forward proxy host:port; "" for direct
	MCPURL      string // MCP endpoint (Sandgate's /mcp, or the upstream itself for direct)
	RouteURL    string // base URL of the model API (Sandgate's route, or the stand-in for direct)
	Admin       string // Sandgate's admin listener
	InterceptCA []byte // PEM of the CA the proxy signs intercepted hosts with
	proc        *process
	companions  []*process // stopped after proc (the export variant's Collector), not measured
}

// Sample reads the proxy's process group from /proc (zero for direct).
func (t *Target) Sample() (ProcSample, bool) {
	if t.proc == nil {
		return ProcSample{}, false
	}
	s, err := sampleGroup(t.proc.PID())
	return s, err == nil
}

// ResetPeak starts a new peak-RSS window.
func (t *Target) ResetPeak() {
	if t.proc != nil {
		resetGroupPeakRSS(t.proc.PID())
	}
}

// Stop ends the proxy process.
func (t *Target) Stop() {
	if t.proc != nil {
		t.proc.Stop(10 * time.Second)
	}
	for _, p := range t.companions {
		p.Stop(10 * time.Second)
	}
}

// peerDir makes a folder the peers' unprivileged users (squid drops to "proxy") can write.
func peerDir(root, name string) (string, error) {
	d := filepath.Join(root, name)
	if err := os.MkdirAll(d, 0o777); err != nil {
		return "", fmt.Errorf("%s dir: %w", name, err)
	}
	return d, os.Chmod(d, 0o777)
}

// peerAddrs makes a peer's folder and picks n free loopback addresses for it.
func peerAddrs(root, name string, n int) (dir string, addrs []string, err error) {
	if dir, err = peerDir(root, name); err != nil {
		return "", nil, err
	}
	for range n {
		port, err := freePort()
		if err != nil {
			return "", nil, err
		}
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
	}
	return dir, addrs, nil
}

// startRelay starts bench/cmd/relay (built to bin).
func startRelay(ctx context.Context, bin, root string, up *Upstreams) (*Target, error) {
	dir, addrs, err := peerAddrs(root, "relay", 3)
	if err != nil {
		return nil, err
	}
	_, tlsPort, _ := net.SplitHostPort(up.TLSAddr)
	p, err := startProcess("relay", dir, nil, bin, "-listen", addrs[0],
		"-route-listen", addrs[1], "-route-upstream", "https://"+modelHost+":"+tlsPort,
		"-route-ca", up.CAPath, "-route-dial", up.TLSAddr,
		"-mcp-listen", addrs[2], "-mcp-upstream", up.MCPURL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if err := p.waitTCP(ctx, a, 10*time.Second); err != nil {
			p.Stop(time.Second)
			return nil, err
		}
	}
	return &Target{Name: "relay", Proxy: addrs[0], RouteURL: "http://" + addrs[1] + "/routes/anthropic",
		MCPURL: "http://" + addrs[2] + "/mcp", proc: p}, nil
}

// startGoproxy runs the relay binary as goproxy's own TLS interception (bench/cmd/relay
// -mitm-listen), signing with Sandgate's CA so that the same clients trust both.
func startGoproxy(ctx context.Context, bin, root, caDir string, up *Upstreams) (*Target, error) {
	dir, addrs, err := peerAddrs(root, "goproxy", 1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	p, err := startProcess("goproxy", dir, nil, bin, "-listen", "", "-mitm-listen", addr,
		"-mitm-ca-cert", filepath.Join(caDir, proxy.CACertFile), "-mitm-ca-key", filepath.Join(caDir, proxy.CAKeyFile),
		"-route-ca", up.CAPath, "-route-dial", up.TLSAddr)
	if err != nil {
		return nil, err
	}
	if err := p.waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return &Target{Name: "goproxy", Proxy: addr, proc: p}, nil
}

// startSquid runs Squid in the foreground (-N) with a config of its own: memory only, no
// caching, one access-log line per request (as Sandgate writes one audit event), no Via or
// X-Forwarded-For.
func startSquid(ctx context.Context, root string) (*Target, error) {
	bin, err := exec.LookPath("squid")
	if err != nil {
		return nil, fmt.Errorf("squid not installed (make setup installs it): %w", err)
	}
	dir, addrs, err := peerAddrs(root, "squid", 1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	conf := fmt.Sprintf(`http_port %s
visible_hostname bench
pid_filename %[2]s/squid.pid
cache_log %[2]s/cache.log
access_log stdio:%[2]s/access.log
coredump_dir %[2]s
cache deny all
cache_mem 8 MB
max_filedescriptors 65536
http_access allow all
forwarded_for delete
via off
shutdown_lifetime 0 seconds
`, addr, dir)
	cf := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("squid config: %w", err)
	}
	p, err := startProcess("squid", dir, nil, bin, "-N", "-f", cf)
	if err != nil {
		return nil, err
	}
	if err := p.waitTCP(ctx, addr, 30*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return &Target{Name: "squid", Proxy: addr, proc: p}, nil
}

// startTinyproxy runs tinyproxy in the foreground (-d) with a config of its own.
func startTinyproxy(ctx context.Context, root string) (*Target, error) {
	bin, err := exec.LookPath("tinyproxy")
	if err != nil {
		return nil, fmt.Errorf("tinyproxy not installed (make setup installs it): %w", err)
	}
	dir, addrs, err := peerAddrs(root, "tinyproxy", 1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	conf := fmt.Sprintf(`User nobody
Group nogroup
Port %s
Listen 127.0.0.1
Timeout 600
MaxClients 4096
LogFile "%[2]s/tinyproxy.log"
LogLevel Info
PidFile "%[2]s/tinyproxy.pid"
Allow 127.0.0.0/8
DisableViaHeader Yes
`, addr[strings.LastIndexByte(addr, ':')+1:], dir)
	cf := filepath.Join(dir, "tinyproxy.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("tinyproxy config: %w", err)
	}
	p, err := startProcess("tinyproxy", dir, nil, bin, "-d", "-c", cf)
	if err != nil {
		return nil, err
	}
	if err := p.waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return &Target{Name: "tinyproxy", Proxy: addr, proc: p}, nil
}
