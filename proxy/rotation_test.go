package proxy

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// held is the stand-in endpoint of a request still in flight when its key is rotated: it
// reports the key it was sent, waits for release, then echoes that key in its body, as an
// upstream's error page does.
var held struct {
	mu      sync.Mutex
	key     chan string
	release chan struct{}
}

// holdRequests arms /v1/held for one test.
func holdRequests() (key chan string, release chan struct{}) {
	held.mu.Lock()
	defer held.mu.Unlock()
	held.key, held.release = make(chan string, 1), make(chan struct{})
	return held.key, held.release
}

func init() {
	standInPaths["/v1/held"] = func(w http.ResponseWriter, r *http.Request) {
		held.mu.Lock()
		key, release := held.key, held.release
		held.mu.Unlock()
		key <- r.Header.Get("X-Api-Key")
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"error":{"message":"invalid x-api-key `+r.Header.Get("X-Api-Key")+`"}}`)
	}
}

// rotateKubeSecret publishes value as the kubelet updates a mounted Secret: a new timestamped
// folder, a new ..data symlink renamed over the old one (docs/install.md, "Rotate a credential").
func rotateKubeSecret(t *testing.T, dir, gen, value string) {
	t.Helper()
	require.NoError(t, os.Mkdir(filepath.Join(dir, gen), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, gen, "api-key"), []byte(value+"\n"), 0o600))
	require.NoError(t, os.Symlink(gen, filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
}

// TestRotationWithARequestInFlight rotates the route's key, mounted as a Kubernetes Secret,
// while a request sent with the old key waits upstream: the next request carries the new key,
// and the answer to the first, which echoes the old key (still valid at the provider until the
// operator revokes it), reaches the sandbox with that key redacted.
func TestRotationWithARequestInFlight(t *testing.T) {
	const oldKey, newKey = "sk-ant-rotation-old-0001", "sk-ant-rotation-new-0002"
	sandboxReads.Secret(oldKey)
	sandboxReads.Secret(newKey)
	dir := t.TempDir()
	rotateKubeSecret(t, dir, "..2026_12_01_21_00_01", oldKey)
	require.NoError(t, os.Symlink(filepath.Join("..data", "api-key"), filepath.Join(dir, "api-key")))
	store, err := credential.NewStore([]config.Credential{{Name: "anthropic", File: filepath.Join(dir, "api-key")}}, nil, nil)
	require.NoError(t, err)
	h := newHarnessWith(t, func(o *Options) { o.Credentials = store })
	const alpha = "127.0.0.2"
	msg := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`

	heldKey, release := holdRequests()
	first := make(chan string, 1)
	go func() {
		resp, err := h.client(t, alpha).Post("http://"+h.addr+"/routes/anthropic/v1/held", "application/json", strings.NewReader(msg))
		if err != nil {
			first <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		first <- string(b)
	}()
	assert.Equal(t, oldKey, <-heldKey, "the first request carries the key of its time")

	rotateKubeSecret(t, dir, "..2026_12_01_21_05_00", newKey)
	require.Equal(t, []string{"anthropic"}, store.Refresh())
	resp, err := h.client(t, alpha).Post("http://"+h.addr+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(msg))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	keys, _ := h.up.seen()
	assert.Equal(t, newKey, keys[len(keys)-1], "the next request carries the rotated key")

	close(release)
	body := <-first
	assert.Contains(t, body, "invalid x-api-key", "the held request was answered")
	assert.NotContains(t, body, oldKey, "the old key, echoed after the rotation, is redacted")
	ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == "/v1/held" })
	assert.Equal(t, "anthropic", ev.Credential, "the event names the credential, never its value")
}
