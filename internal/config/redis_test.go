package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestRedisTopologyErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc, wantErr string
	}{
		{"two topologies at once", "redis:\n  addr: redis:6379\n  cluster: {addrs: ['a:6379']}\n",
			"redis: set exactly one of redis.addr, redis.sentinel and redis.cluster, not 2"},
		{"sentinel without a master name", "redis:\n  sentinel: {addrs: ['s:26379']}\n", "redis.sentinel.master_name: must not be empty"},
		{"sentinel without addresses", "redis:\n  sentinel: {master_name: mymaster}\n", "redis.sentinel.addrs: must list at least one host:port"},
		{"sentinel address without port", "redis:\n  sentinel: {master_name: m, addrs: ['s:26379', s]}\n", `redis.sentinel.addrs[1]: "s" is not host:port`},
		{"sentinel password names a missing credential", "redis:\n  sentinel: {master_name: m, addrs: ['s:26379'], password_credential: nope}\n",
			`redis.sentinel.password_credential: no credential named "nope"`},
		{"cluster without addresses", "redis:\n  cluster: {addrs: []}\n", "redis.cluster.addrs: must list at least one host:port"},
		{"cluster address out of range", "redis:\n  cluster: {addrs: ['c:99999']}\n", "redis.cluster.addrs[0]: port 99999 out of range"},
		{"cluster with a database number", "redis:\n  cluster: {addrs: ['c:6379']}\n  db: 2\n", "redis.db: a Redis Cluster has only database 0"},
		{"ACL user without a password", "redis:\n  addr: redis:6379\n  username: sandgate\n", "redis.username: an ACL user needs its password"},
		{"TLS without a topology", "redis:\n  tls: {ca_file: ca.pem}\n", "redis.tls: set redis.addr, redis.sentinel or redis.cluster too"},
		{"TLS client certificate without its key", "redis:\n  addr: redis:6379\n  tls: {cert_file: c.pem}\n",
			"redis.tls.cert_file: set both redis.tls.cert_file and redis.tls.key_file"},
		{"misspelt TLS field", "redis:\n  addr: redis:6379\n  tls: {ca: ca.pem}\n", `unknown field "redis.tls.ca"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestRedisTopologies(t *testing.T) {
	for _, tc := range []struct {
		name, doc, topology string
	}{
		{"none keeps state in memory", "redis: {}\n", ""},
		{"single node", "redis:\n  addr: redis:6379\n", "single"},
		{"sentinel", "credentials: [{name: spw, env: SPW}]\nredis:\n  sentinel: {master_name: mymaster, addrs: ['s1:26379', 's2:26379'], password_credential: spw}\n", "sentinel"},
		{"cluster", "redis:\n  cluster: {addrs: ['c1:6379', 'c2:6379']}\n", "cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tc.doc), "/etc/sandgate")
			require.NoError(t, err)
			assert.Equal(t, tc.topology, c.Redis.Topology())
			assert.Equal(t, tc.topology != "", c.Redis.Enabled())
			assert.Equal(t, tc.topology != "", c.Redis.AuditStreamEnabled())
		})
	}
}

func TestRedisTLSFilesAreRelativeToTheConfigAndChecked(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("x"), 0o600))
	doc := "audit: {file: {dir: " + dir + "/audit}}\npolicy: {dir: " + dir + "}\n" +
		"redis:\n  addr: redis:6379\n  tls: {ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}\n"
	c, err := config.Parse([]byte(doc), dir)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "ca.pem"), c.Redis.TLS.CAFile)
	err = c.CheckFiles(false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redis.tls.cert_file: "+filepath.Join(dir, "client.pem"))
	assert.Contains(t, err.Error(), "redis.tls.key_file: ")
	assert.NotContains(t, err.Error(), "redis.tls.ca_file")
	assert.NoError(t, c.CheckFiles(true), "offline: the pod's TLS files are not here")
}

// Each replica's stream carries its own hash tag (audit.ReplicaStream), so the base name needs
// none in a Cluster.
func TestAuditStreamNameIsTheSameOnEveryTopology(t *testing.T) {
	for _, doc := range []string{"redis:\n  cluster: {addrs: ['c:6379']}\n", "redis:\n  addr: r:6379\n",
		"redis:\n  cluster: {addrs: ['c:6379']}\n  audit_stream: {name: 'sg:audit'}\n"} {
		c, err := config.Parse([]byte(doc), "/")
		require.NoError(t, err, doc)
		assert.Contains(t, []string{"sandgate:audit", "sg:audit"}, c.Redis.AuditStream.Name)
	}
}
