package credential

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// secretVolume is a folder laid out as the kubelet mounts a Secret volume: the file the
// config names is a symlink through ..data, a symlink to a timestamped folder holding the
// real files. The kubelet updates it by writing a new timestamped folder, pointing a new
// symlink at it and renaming that over ..data, then deleting the old folder: the config's path
// never changes, what it resolves to does, in one atomic rename.
type secretVolume struct {
	dir string
	gen int
}

func newSecretVolume(t *testing.T, key, value string) *secretVolume {
	t.Helper()
	v := &secretVolume{dir: t.TempDir()}
	v.swap(t, key, value)
	require.NoError(t, os.Symlink(filepath.Join("..data", key), filepath.Join(v.dir, key)))
	return v
}

// swap publishes a new value as the kubelet does.
func (v *secretVolume) swap(t *testing.T, key, value string) {
	t.Helper()
	v.gen++
	ts := "..2026_12_01_21_00_0" + string(rune('0'+v.gen))
	require.NoError(t, os.Mkdir(filepath.Join(v.dir, ts), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(v.dir, ts, key), []byte(value+"\n"), 0o600))
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	require.NoError(t, os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")))
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(v.dir, old)))
	}
}

// logBuffer is a logger into a buffer, to check what the store logs.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

func TestNewStoreReadsFilesAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key"), []byte("sk-file-value\r\n"), 0o600))
	s, err := NewStore([]config.Credential{{Name: "file", File: filepath.Join(dir, "key")}, {Name: "env", Env: "TOKEN"}},
		func(k string) string { return map[string]string{"TOKEN": "sk-env-value"}[k] }, nil)
	require.NoError(t, err)
	v, ok := s.Get("file")
	assert.True(t, ok)
	assert.Equal(t, "sk-file-value", v, "the trailing line break a Secret file often has is not part of the value")
	v, _ = s.Get("env")
	assert.Equal(t, "sk-env-value", v)
	_, ok = s.Get("missing")
	assert.False(t, ok)
	assert.ElementsMatch(t, []string{"sk-file-value", "sk-env-value"}, s.Values())
}

func TestNewStoreErrorsNameTheCredentialNotTheValue(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for _, tc := range []struct {
		name string
		src  config.Credential
		want string
	}{
		{"a missing file", config.Credential{Name: "anthropic", File: filepath.Join(dir, "nope")}, "credentials[0] (anthropic): read credential file"},
		{"an empty file", config.Credential{Name: "anthropic", File: empty}, "is empty"},
		{"an unset variable", config.Credential{Name: "github", Env: "GH_TOKEN"}, "environment variable GH_TOKEN is unset or empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewStore([]config.Credential{tc.src}, func(string) string { return "" }, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestRefreshFollowsAFileReplaced replaces the file as an editor or `kubectl cp` does (a new
// file renamed over the old one) and in place: each refresh reports the change by name.
func TestRefreshFollowsAFileReplaced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api-key")
	require.NoError(t, os.WriteFile(path, []byte("sk-old-0001"), 0o600))
	s, err := NewStore([]config.Credential{{Name: "anthropic", File: path}}, nil, nil)
	require.NoError(t, err)

	tmp := filepath.Join(dir, ".api-key.tmp")
	require.NoError(t, os.WriteFile(tmp, []byte("sk-new-0002\n"), 0o600))
	require.NoError(t, os.Rename(tmp, path))
	assert.Equal(t, []string{"anthropic"}, s.Refresh())
	v, _ := s.Get("anthropic")
	assert.Equal(t, "sk-new-0002", v)

	require.NoError(t, os.WriteFile(path, []byte("sk-new-0003"), 0o600))
	assert.Equal(t, []string{"anthropic"}, s.Refresh())
	v, _ = s.Get("anthropic")
	assert.Equal(t, "sk-new-0003", v)
	assert.Empty(t, s.Refresh(), "nothing changed, nothing reported")
}

// TestRefreshFollowsASecretVolumeSwap rotates a value the way the kubelet updates a mounted
// Secret (docs/install.md, "Rotate a credential"): the store follows the ..data symlink swap.
func TestRefreshFollowsASecretVolumeSwap(t *testing.T) {
	vol := newSecretVolume(t, "api-key", "sk-ant-first-value")
	s, err := NewStore([]config.Credential{{Name: "anthropic", File: filepath.Join(vol.dir, "api-key")}}, nil, nil)
	require.NoError(t, err)
	v, _ := s.Get("anthropic")
	require.Equal(t, "sk-ant-first-value", v)

	vol.swap(t, "api-key", "sk-ant-second-value")
	assert.Equal(t, []string{"anthropic"}, s.Refresh())
	v, _ = s.Get("anthropic")
	assert.Equal(t, "sk-ant-second-value", v)
}

// TestRefreshKeepsTheLastValueWhileAFileIsAbsent refreshes while the file is gone or empty, as
// it briefly is while some tools rotate it: the last value stays, and the log names the
// credential, never a value.
func TestRefreshKeepsTheLastValueWhileAFileIsAbsent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api-key")
	require.NoError(t, os.WriteFile(path, []byte("sk-kept-value"), 0o600))
	log, logged := logBuffer()
	s, err := NewStore([]config.Credential{{Name: "anthropic", File: path}}, nil, log)
	require.NoError(t, err)

	require.NoError(t, os.Remove(path))
	assert.Empty(t, s.Refresh())
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	assert.Empty(t, s.Refresh())
	v, _ := s.Get("anthropic")
	assert.Equal(t, "sk-kept-value", v)

	require.NoError(t, os.WriteFile(path, []byte("sk-next-value"), 0o600))
	assert.Equal(t, []string{"anthropic"}, s.Refresh())
	assert.Contains(t, logged.String(), "credential=anthropic")
	assert.NotContains(t, logged.String(), "sk-kept-value")
	assert.NotContains(t, logged.String(), "sk-next-value")
}

// TestValuesKeepARotatedValue rotates a key while a request sent with it may still be
// answered: the old value stays among Values, so a response that echoes it is still scrubbed
// (the provider accepts the old key until the operator revokes it). Only the current value is
// injected.
func TestValuesKeepARotatedValue(t *testing.T) {
	vol := newSecretVolume(t, "api-key", "sk-ant-in-flight-1")
	s, err := NewStore([]config.Credential{{Name: "anthropic", File: filepath.Join(vol.dir, "api-key")}}, nil, nil)
	require.NoError(t, err)
	inFlight, _ := s.Get("anthropic") // a request took the key and is waiting upstream

	vol.swap(t, "api-key", "sk-ant-rotated-2")
	require.Equal(t, []string{"anthropic"}, s.Refresh())
	v, _ := s.Get("anthropic")
	assert.Equal(t, "sk-ant-rotated-2", v, "new requests carry the new key")
	assert.Contains(t, s.Values(), inFlight, "the old key is still scrubbed from what its request brings back")
	assert.Contains(t, s.Values(), "sk-ant-rotated-2")

	for i := range retainRetired + 1 {
		vol.swap(t, "api-key", "sk-ant-later-"+string(rune('a'+i)))
		require.Len(t, s.Refresh(), 1)
	}
	assert.NotContains(t, s.Values(), inFlight, "earlier values are kept for a few rotations, not for ever")
	assert.Len(t, s.Values(), 1+retainRetired)
}

// TestWatchRefreshesOnEveryTick drives Watch's loop with ticks of the test's own: a rotated
// file is picked up after the next tick, and the loop ends with its context.
func TestWatchRefreshesOnEveryTick(t *testing.T) {
	vol := newSecretVolume(t, "api-key", "sk-ant-watched-1")
	s, err := NewStore([]config.Credential{{Name: "anthropic", File: filepath.Join(vol.dir, "api-key")}}, nil, nil)
	require.NoError(t, err)
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.watch(ctx, ticks); close(done) }()

	vol.swap(t, "api-key", "sk-ant-watched-2")
	ticks <- time.Time{} // received: the refresh runs before the next receive
	ticks <- time.Time{}
	v, _ := s.Get("anthropic")
	assert.Equal(t, "sk-ant-watched-2", v)
	cancel()
	<-done
}

func TestInjectReplacesTheSandboxsValue(t *testing.T) {
	h := http.Header{"X-Api-Key": {"sandbox-placeholder"}, "Authorization": {"Bearer sandbox"}}
	Inject(h, &config.CredentialRef{Name: "anthropic", Header: "X-Api-Key", Format: "{value}"}, "sk-real")
	assert.Equal(t, []string{"sk-real"}, h.Values("X-Api-Key"))
	Inject(h, &config.CredentialRef{Name: "gh", Header: "Authorization", Format: "Bearer {value}"}, "ghp_real")
	assert.Equal(t, []string{"Bearer ghp_real"}, h.Values("Authorization"))
}
