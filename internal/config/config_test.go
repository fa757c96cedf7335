package config_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, wantErr string
	}{
		{"unknown top-level field", "listn:\n  mcp: :8080\n", `unknown field "listn"`},
		{"unknown nested field", "audit:\n  file:\n    maxsize: 3\n", `unknown field "audit.file.maxsize"`},
		{"wrong type", "audit:\n  file:\n    max_size_mb: big\n", "audit.file.max_size_mb: want int, got string"},
		{"listen address without port", "listen:\n  mcp: localhost\n", `listen.mcp: "localhost" is not host:port`},
		{"fsync mode out of range", "audit:\n  file:\n    fsync: sometimes\n", `audit.file.fsync: "sometimes" is not one of batch, always, never`},
		{"duration that does not parse", "audit:\n  file:\n    fsync_interval: soon\n", `want a duration such as "500ms" or "5s", got "soon"`},
		{"negative size", "audit:\n  file:\n    max_size_mb: -1\n", "audit.file.max_size_mb: must be positive"},
		{"negative decision cache", "policy:\n  decision_cache: -5\n", "policy.decision_cache: must be 0 (off) or a number of entries, got -5"},
		{"decision log mask that is no pointer", "policy:\n  decision_log:\n    file: d.log\n    mask: [/input/mcp, token]\n",
			`policy.decision_log.mask[1]: "token" is not a JSON pointer below /input/ or /result/`},
		{"decision log with a negative size", "policy:\n  decision_log:\n    max_size_mb: -1\n", "policy.decision_log.max_size_mb: must be positive"},
		{"log level out of range", "log:\n  level: loud\n", `log.level: "loud" is not one of debug, info, warn, error`},
		{"credential with both sources", "credentials:\n  - name: a\n    file: /x\n    env: A\n", "credentials[0]: set exactly one of file or env"},
		{"credential with no source", "credentials:\n  - name: a\n", "credentials[0]: set exactly one of file or env"},
		{"credential value written inline", "credentials:\n  - name: a\n    value: sk-123\n", `unknown field "credentials[0].value"`},
		{"credential without name", "credentials:\n  - env: A\n", "credentials[0].name: must not be empty"},
		{"credential name with odd characters", "credentials:\n  - name: 'a b'\n    env: A\n", `credentials[0].name: "a b" may contain only`},
		{"duplicate credential", "credentials:\n  - name: a\n    env: A\n  - name: a\n    env: B\n", `credentials[1].name: "a" is already defined by credentials[0]`},
		{"admin token names a missing credential", "admin:\n  token_credential: nope\n", `admin.token_credential: no credential named "nope"`},
		{"static identity with a bad address", "identity:\n  static:\n    - sandbox: a\n      addresses: [nope]\n", `identity.static[0].addresses[0]: "nope" is neither an IP address nor a CIDR prefix`},
		{"static identity address claimed twice", "identity:\n  static:\n    - sandbox: a\n      addresses: [127.0.0.2]\n    - sandbox: b\n      addresses: [127.0.0.2]\n", "identity.static[1].addresses[0]: 127.0.0.2/32 is already given to identity.static[0]"},
		{"listen port out of range", "listen:\n  mcp: 127.0.0.1:80800\n", "listen.mcp: port 80800 out of range 1-65535"},
		{"listen port zero", "listen:\n  admin: :0\n", "listen.admin: port 0 out of range 1-65535"},
		{"listen port that is a name", "listen:\n  proxy: 127.0.0.1:http\n", `listen.proxy: port "http" is not a number`},
		{"listen host that is no host name", "listen:\n  mcp: bad_host!:8080\n", `listen.mcp: host "bad_host!" is neither an IP address nor a host name`},
		{"listen IPv6 address without brackets", "listen:\n  mcp: ::1:8080\n", `listen.mcp: "::1:8080" is not host:port`},
		{"redis port out of range", "redis:\n  addr: redis:70000\n", "redis.addr: port 70000 out of range 1-65535"},
		{"negative duration names its field", "audit:\n  file:\n    fsync_interval: -5s\n", `audit.file.fsync_interval: duration "-5s" is negative`},
		{"duration without unit names its field", "gateway:\n  upstreams:\n    - {name: a, url: http://a}\n    - {name: b, url: http://b, connect_timeout: 5}\n",
			`gateway.upstreams[1].connect_timeout: want a duration with a unit such as "500ms" or "5s", got 5`},
		{"duration that does not parse names its field", "limits:\n  concurrency_lease: soon\n", `limits.concurrency_lease: want a duration such as "500ms" or "5s", got "soon"`},
		{"wrong type in a list names the position", "gateway:\n  upstreams:\n    - {name: a, command: x, args: 3}\n", "gateway.upstreams[0].args: want []string, got number"},
		{"wrong type under a map names the key", "limits:\n  templates:\n    coder:\n      total: {tokens_per_day: lots}\n", "limits.templates.coder.total.tokens_per_day: want int64, got string"},
		{"wrong type in an inline struct names the key", "limits:\n  templates:\n    coder: {requests_per_minute: lots}\n", "limits.templates.coder.requests_per_minute: want int64, got string"},
		{"audit chain key names a missing credential", "audit:\n  chain_key_credential: nope\n", `audit.chain_key_credential: no credential named "nope"`},
		{"checkpoint signing key names a missing credential", "audit:\n  checkpoint:\n    signing_key_credential: nope\n", `audit.checkpoint.signing_key_credential: no credential named "nope"`},
		{"negative checkpoint interval in events", "credentials:\n  - name: k\n    env: K\naudit:\n  checkpoint:\n    signing_key_credential: k\n    every_events: -1\n", "audit.checkpoint.every_events: must be a positive number"},
		{"checkpoint interval that does not parse", "audit:\n  checkpoint:\n    every: often\n", `want a duration such as "500ms" or "5s", got "often"`},
		{"misspelt checkpoint field", "audit:\n  checkpoint:\n    every_event: 5\n", `unknown field "audit.checkpoint.every_event"`},
		{"not YAML at all", "listen: [\n", "decode:"},
		{"two listeners on one address", "listen:\n  mcp: 127.0.0.1:8080\n  proxy: 127.0.0.1:8080\n", `listen.proxy: "127.0.0.1:8080" is the address of listen.mcp too`},
		{"a listener on every interface and one on the same port", "listen:\n  mcp: :9090\n  admin: 127.0.0.1:9090\n", `listen.admin: "127.0.0.1:9090" is the address of listen.mcp too`},
		{"IPv4 any and a host name on one port", "listen:\n  proxy: 0.0.0.0:3128\n  admin: sandgate:3128\n", `listen.admin: "sandgate:3128" is the address of listen.proxy too`},
		{"audit delivery out of range", "audit:\n  delivery: batch\n", `audit.delivery: "batch" is not one of blocking, async`},
		{"shutdown delay too long", "shutdown:\n  delay: 1h\n", "shutdown.delay: 1h0m0s is longer than 10m0s"},
		{"shutdown drain that is no duration", "shutdown:\n  drain: 20\n", `shutdown.drain: want a duration with a unit`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestListenAddressesThatParse(t *testing.T) {
	for _, addr := range []string{":8080", "127.0.0.1:1", "[::1]:65535", "localhost:9090", "sandgate.sandgate.svc:3128", "0.0.0.0:8080"} {
		_, err := config.Parse([]byte("listen:\n  mcp: \""+addr+"\"\n"), "/")
		assert.NoError(t, err, addr)
	}
}

func TestListenersOnDistinctAddressesLoad(t *testing.T) {
	for _, doc := range []string{
		"listen: {mcp: 127.0.0.1:8080, proxy: 127.0.0.1:3128, admin: 127.0.0.1:9090}\n",
		"listen: {mcp: 127.0.0.2:8080, proxy: 127.0.0.3:8080}\n",
		"listen: {mcp: ':8080', proxy: ':3128', admin: ''}\n",
	} {
		_, err := config.Parse([]byte(doc), "/")
		assert.NoError(t, err, doc)
	}
}

func TestShutdownAndDeliveryDefaults(t *testing.T) {
	c, err := config.Parse(nil, "/")
	require.NoError(t, err)
	assert.Equal(t, config.AuditBlocking, c.Audit.Delivery)
	assert.Equal(t, 5*time.Second, c.Shutdown.DelayD())
	assert.Equal(t, 20*time.Second, c.Shutdown.DrainD())
	c, err = config.Parse([]byte("audit: {delivery: async}\nshutdown: {delay: 0s, drain: 3s}\n"), "/")
	require.NoError(t, err)
	assert.Equal(t, config.AuditAsync, c.Audit.Delivery)
	assert.Equal(t, time.Duration(0), c.Shutdown.DelayD(), "0s is kept, not taken for unset")
	assert.Equal(t, 3*time.Second, c.Shutdown.DrainD())
}

func TestDurationNullKeepsTheDefault(t *testing.T) {
	c, err := config.Parse([]byte("audit:\n  file:\n    fsync_interval:\n"), "/")
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond, c.Audit.File.FsyncInterval.D())
}

func TestParseReportsEveryMistakeAtOnce(t *testing.T) {
	_, err := config.Parse([]byte("log:\n  level: loud\n  format: xml\naudit:\n  file:\n    fsync: x\n"), "/")
	require.Error(t, err)
	for _, field := range []string{"log.level", "log.format", "audit.file.fsync"} {
		assert.Contains(t, err.Error(), field)
	}
}

func TestDefaultsAndRelativePaths(t *testing.T) {
	c, err := config.Parse([]byte("credentials:\n  - name: k\n    file: secrets/k\n"), "/etc/sandgate")
	require.NoError(t, err)
	assert.Equal(t, "/etc/sandgate/policies", c.Policy.Dir)
	assert.Equal(t, "/etc/sandgate/var/audit", c.Audit.File.Dir)
	assert.Equal(t, "/etc/sandgate/secrets/k", c.Credentials[0].File)
	assert.Equal(t, 64, c.Audit.File.MaxSizeMB)
	assert.Equal(t, "batch", c.Audit.File.Fsync)
	assert.Equal(t, 100*time.Millisecond, c.Audit.File.FsyncInterval.D())
	assert.Equal(t, 1000, c.Audit.Checkpoint.EveryEvents)
	assert.Equal(t, time.Minute, c.Audit.Checkpoint.Every.D())
	assert.True(t, c.Policy.WatchEnabled())
	assert.Equal(t, 10*time.Second, c.Policy.PollInterval.D())
}

func TestExampleConfigLoads(t *testing.T) {
	c, err := config.Load("../../examples/sandgate.yaml")
	require.NoError(t, err)
	abs, _ := filepath.Abs("../../policies")
	assert.Equal(t, abs, c.Policy.Dir)
	assert.NotEmpty(t, c.Identity.Static)
}

func TestLoadNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(p, []byte("log:\n  level: loud\n"), 0o600))
	_, err := config.Load(p)
	require.ErrorContains(t, err, "bad.yaml: log.level")
	_, err = config.Load(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "read config")
}
