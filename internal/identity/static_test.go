package identity_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

func staticMap(t *testing.T) *identity.Static {
	t.Helper()
	s, err := identity.NewStatic([]identity.StaticEntry{
		{Addresses: []string{"127.0.0.2"}, Namespace: "agents", Sandbox: "coder", Template: "coding-agent", Labels: map[string]string{"team": "a"}},
		{Addresses: []string{"127.0.0.3", "::1"}, Namespace: "agents", Sandbox: "triage", Template: "triage-agent"},
		{Addresses: []string{"10.1.0.0/16"}, Namespace: "pool", Sandbox: "pool-wide", Template: "t"},
		{Addresses: []string{"10.1.2.0/24"}, Namespace: "pool", Sandbox: "pool-narrow", Template: "t"},
	})
	require.NoError(t, err)
	return s
}

func TestStaticResolve(t *testing.T) {
	s := staticMap(t)
	cases := []struct {
		name, peer, wantSandbox string
		wantKnown               bool
	}{
		{"exact IPv4 address", "127.0.0.2:5555", "coder", true},
		{"second address of a sandbox", "[::1]:80", "triage", true},
		{"IPv4-mapped IPv6 peer is the IPv4 caller", "[::ffff:127.0.0.2]:1", "coder", true},
		{"most specific prefix wins", "10.1.2.9:1", "pool-narrow", true},
		{"wider prefix covers the rest", "10.1.9.9:1", "pool-wide", true},
		{"unknown address is anonymous", "127.0.0.9:1", "", false},
		{"unparsable peer is anonymous", "not-an-address", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := identity.FromRemoteAddr(s, tc.peer)
			assert.Equal(t, tc.wantSandbox, id.Sandbox)
			assert.Equal(t, tc.wantKnown, id.Known)
			if tc.wantKnown {
				assert.NotEmpty(t, id.SourceIP)
			}
		})
	}
	assert.Equal(t, "anonymous", identity.FromRemoteAddr(s, "127.0.0.9:1").Key())
	assert.Equal(t, "agents/coder", identity.FromRemoteAddr(s, "127.0.0.2:1").Key())
}

func TestStaticRejectsBadEntries(t *testing.T) {
	cases := []struct {
		name    string
		entries []identity.StaticEntry
		wantErr string
	}{
		{"address that does not parse", []identity.StaticEntry{{Sandbox: "a", Addresses: []string{"300.1.1.1"}}}, "sandboxes[0].addresses[0]: \"300.1.1.1\" is neither an IP address nor a CIDR prefix"},
		{"address claimed twice", []identity.StaticEntry{{Sandbox: "a", Addresses: []string{"127.0.0.2"}}, {Sandbox: "b", Addresses: []string{"127.0.0.2/32"}}}, "sandboxes[1].addresses[0]: 127.0.0.2/32 is already given to sandboxes[0]"},
		{"sandbox without name", []identity.StaticEntry{{Addresses: []string{"127.0.0.2"}}}, "sandboxes[0].sandbox: must not be empty"},
		{"sandbox without address", []identity.StaticEntry{{Sandbox: "a"}}, "sandboxes[0].addresses: sandbox \"a\" has no address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := identity.NewStatic(tc.entries)
			require.EqualError(t, err, tc.wantErr)
		})
	}
}

// A real HTTP server resolves its callers; clients bound to distinct loopback sources send every
// header a sandbox could use to claim another identity.
func TestSpoofedHeadersChangeNothing(t *testing.T) {
	s := staticMap(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(identity.FromRequest(s, r))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	spoof := map[string]string{
		"X-Forwarded-For":          "127.0.0.3",
		"X-Real-IP":                "127.0.0.3",
		"Forwarded":                "for=127.0.0.3",
		"X-Sandbox-Name":           "triage",
		"X-Sandbox-Id":             "agents/triage",
		"True-Client-IP":           "127.0.0.3",
		"X-Client-IP":              "127.0.0.3",
		"X-Original-Forwarded-For": "127.0.0.3",
	}
	for _, src := range []struct{ addr, wantSandbox string }{{"127.0.0.2", "coder"}, {"127.0.0.9", ""}} {
		client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP(src.addr)}, Timeout: 5 * time.Second}).DialContext}}
		req, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+ln.Addr().String(), nil)
		require.NoError(t, err)
		for k, v := range spoof {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		var id identity.Identity
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&id))
		resp.Body.Close()
		assert.Equal(t, src.wantSandbox, id.Sandbox, "caller from %s", src.addr)
		assert.Equal(t, src.addr, id.SourceIP)
		assert.Equal(t, src.wantSandbox != "", id.Known)
	}
}

func FuzzParsePeer(f *testing.F) {
	for _, s := range []string{"127.0.0.1:80", "[::1]:1", "[fe80::1%eth0]:22", "1.2.3.4", "", ":", "[", "::ffff:1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := identity.ParsePeer(s)
		if ok && (!a.IsValid() || a.Zone() != "" || a.Is4In6()) {
			t.Fatalf("ParsePeer(%q) = %v: want a valid, unzoned, unmapped address", s, a)
		}
		_ = netip.Addr{}
	})
}
