package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// smokescreenVersion is the release make setup installs (test/setup.sh: github.com/stripe/smokescreen,
// built from its own module into the tools cache; not a dependency of Sandgate's go.mod).
const smokescreenVersion = "v0.1.0"

// startSmokescreen runs Stripe's Smokescreen, a Go egress proxy that users pick for egress ACLs,
// with a config of its own: loopback only, the stand-ins' loopback range allowed (Smokescreen
// refuses every non-global address by default, as Sandgate's dial guard does), and an enforcing
// egress ACL whose default rule allows the stand-ins' address, so every request is decided by
// an ACL as Sandgate's are by policy. Clients present no certificate, so the default rule is the
// one that applies (allow_missing_role). Its one log line per request goes to its folder.
func startSmokescreen(ctx context.Context, bin, root string) (*Target, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("smokescreen not installed (make setup builds it): %w", err)
	}
	dir, addrs, err := peerAddrs(root, "smokescreen", 2)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	acl := `version: v1
services: []
default:
  name: bench
  project: bench
  action: enforce
  allowed_domains: ["` + upstreamIP + `"]
`
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	conf := fmt.Sprintf(`ip: 127.0.0.1
port: %s
allow_ranges: ["127.0.0.0/8"]
allow_missing_role: true
acl_file: %s
statsd_address: %s
`, port, filepath.Join(dir, "acl.yaml"), addrs[1])
	for name, b := range map[string]string{"acl.yaml": acl, "smokescreen.yaml": conf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o644); err != nil {
			return nil, fmt.Errorf("smokescreen config: %w", err)
		}
	}
	p, err := startProcess("smokescreen", dir, nil, bin, "--config-file", filepath.Join(dir, "smokescreen.yaml"))
	if err != nil {
		return nil, err
	}
	if err := p.waitTCP(ctx, addr, 10*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return &Target{Name: "smokescreen", Proxy: addr, proc: p}, nil
}
