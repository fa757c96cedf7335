package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

// tmpfsEnv carries the mount point to the test re-executed in its own mount namespace.
const tmpfsEnv = "SANDGATE_TEST_TMPFS_DIR"

// inSmallTmpfs runs the calling test again in a private mount namespace (unshare -m) where a
// 256 KiB tmpfs is mounted on the directory it returns: a real file system that really fills
// up, gone with the namespace. It returns "" in the parent, whose test then ends. It needs
// root: it skips otherwise, and fails under SANDGATE_REQUIRE_TOOLS (CI runs as root).
func inSmallTmpfs(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv(tmpfsEnv); dir != "" {
		require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"), "mount a tmpfs on %s", dir)
		return dir
	}
	unshare, err := exec.LookPath("unshare")
	switch {
	case os.Geteuid() != 0 || err != nil:
		msg := "needs root and unshare(1) to mount a small tmpfs in a private mount namespace"
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatal(msg + " (SANDGATE_REQUIRE_TOOLS is set)")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), unshare, "-m", "--propagation", "private",
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), tmpfsEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	require.NoError(t, err, "the test failed in its mount namespace")
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "the test ran there")
	return ""
}

// fillDisk writes dir/filler until the file system is full.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	// Bytes smaller than a page may still fit: fill those too.
	for _, err := f.Write(chunk[:1]); err == nil; _, err = f.Write(chunk[:1]) {
	}
}

// TestFullAuditDiskAnswersNothingUnaudited: the audit log is on a real 256 KiB tmpfs that the
// test fills up while four sandboxes keep calling a tool. Every call that was answered with a
// result has its event in the log (found by its arguments' hash); every other call got the
// fail-closed refusal (audit log unavailable) and is counted as a rejected event; once the
// disk is full every new call is refused; after the filler is removed, calls are served and
// audited again, and the chain verifies. A writer started on a full disk is unhealthy until
// space is freed.
func TestFullAuditDiskAnswersNothingUnaudited(t *testing.T) {
	mnt := inSmallTmpfs(t)
	if mnt == "" {
		return
	}
	auditDir := filepath.Join(mnt, "audit")
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: auditDir, Fsync: audit.FsyncNever, Reserve: 128 << 10})
	require.NoError(t, err)
	w := audit.NewWriter(sink, audit.WithRetryBackoff(50*time.Millisecond))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGatewayWith(t, "testdata/policy", func(o *Options) { o.Audit = w }, config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)

	srcs := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1"}
	var (
		mu       sync.Mutex
		served   = map[string]bool{} // args hash of each call answered with its result
		refused  int
		unwanted []string
	)
	run := func(c *client.Client, n int, tag string) {
		for i := range n {
			msg := fmt.Sprintf("%s-%d", tag, i)
			args := map[string]any{"message": msg}
			res, err := callTool(t, c, "echo", args)
			mu.Lock()
			switch {
			case err == nil && !res.IsError && resultText(res) == msg:
				served[argsHash(args)] = true
			case err != nil && strings.Contains(err.Error(), "audit log unavailable"),
				err == nil && strings.Contains(resultText(res), "audit log unavailable"):
				refused++
			default:
				unwanted = append(unwanted, fmt.Sprintf("%s: %v %v", msg, err, res))
			}
			mu.Unlock()
		}
	}

	// Sessions are opened on a healthy disk.
	clients := make([]*client.Client, len(srcs))
	for i, src := range srcs {
		clients[i] = connectSandbox(t, h.URL(), src, nil)
	}
	run(clients[0], 5, "before") // all served
	require.Len(t, served, 5)
	fillDisk(t, mnt)
	var wg sync.WaitGroup
	for k, c := range clients {
		wg.Go(func() { run(c, 40, fmt.Sprint("full-", k)) })
	}
	wg.Wait()
	assert.Empty(t, unwanted, "every answer is a result or the fail-closed refusal")
	assert.Positive(t, refused, "calls are refused once the disk is full")
	require.Error(t, w.Healthy(), "the writer reports the full disk")
	st := w.Stats()
	assert.True(t, st.ReserveShort)
	before := len(served)
	run(clients[2], 3, "still-full")
	assert.Len(t, served, before, "while the disk stays full every new call is refused")
	t.Logf("after the disk was filled: %d calls served (their events from the reserve or the last free bytes), %d refused", before-5, refused)

	// Still on the full disk: once the events owed are written, each served call has its own.
	require.Eventually(t, func() bool { return w.Stats().ReserveOwed == 0 }, 10*time.Second, 10*time.Millisecond,
		"the events of the admitted calls are written from the reserve")
	refusedInLog := assertAudited(t, auditDir, served)
	// A refusal is in the log when its call had its slot (the disk filled after it began), else
	// counted as an event not recorded.
	assert.GreaterOrEqual(t, int(w.Stats().Rejected)+refusedInLog, refused, "each refusal is accounted for")

	require.NoError(t, os.Remove(filepath.Join(mnt, "filler")))
	c := clients[1]
	require.Eventually(t, func() bool {
		res, err := callTool(t, c, "echo", map[string]any{"message": "after"})
		return err == nil && !res.IsError
	}, 10*time.Second, 20*time.Millisecond, "served again once space is freed")
	served[argsHash(map[string]any{"message": "after"})] = true
	require.NoError(t, w.Close(context.Background()))
	assertAudited(t, auditDir, served)
	rep, err := audit.Verify(auditDir)
	require.NoError(t, err)
	assert.Nil(t, rep.Break, "the chain is intact")

	// Started on a full disk, with a reserve it cannot allocate: unhealthy until space is freed.
	require.NoError(t, os.Remove(filepath.Join(auditDir, audit.ReserveFile)))
	fillDisk(t, mnt)
	sink, err = audit.OpenFileSink(audit.FileConfig{Dir: auditDir, Fsync: audit.FsyncNever, Reserve: 128 << 10})
	require.NoError(t, err)
	w2 := audit.NewWriter(sink, audit.WithRetryBackoff(50*time.Millisecond))
	defer w2.Close(context.Background())
	require.Error(t, w2.Healthy(), "a writer started on a full disk refuses calls")
	_, err = w2.Reserve()
	require.Error(t, err)
	require.NoError(t, os.Remove(filepath.Join(mnt, "filler")))
	require.Eventually(t, func() bool { return w2.Healthy() == nil }, 10*time.Second, 10*time.Millisecond,
		"healthy once the reserve could be allocated")
}

// assertAudited checks that the log in dir has a served tools/call event for each args hash,
// and returns how many tools/call events in it are audit_unavailable refusals.
func assertAudited(t *testing.T, dir string, served map[string]bool) int {
	t.Helper()
	logged, refused := map[string]bool{}, 0
	f, err := os.Open(filepath.Join(dir, audit.ActiveFile))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ev, err := audit.ParseLine(sc.Bytes())
		require.NoError(t, err)
		if ev.Kind == audit.KindToolsCall && ev.Outcome.Status == 200 {
			logged[ev.Target.ArgsSHA256] = true
		}
		if ev.Kind == audit.KindToolsCall && ev.Outcome.Error == "audit_unavailable" {
			refused++
		}
	}
	require.NoError(t, sc.Err())
	missing := 0
	for hash := range served {
		if !logged[hash] {
			missing++
		}
	}
	assert.Zero(t, missing, "answered calls without their event, of %d", len(served))
	return refused
}

// argsHash is the SHA-256 of a tool call's arguments as the sandbox sends them (the event's
// target.args_sha256): mcp-go's client writes a map as json.Marshal does.
func argsHash(args map[string]any) string {
	b, _ := json.Marshal(args)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
