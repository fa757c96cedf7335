package policy_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/policy"
)

// waitDeadline bounds every wait for the watcher: generous for a busy 2-core machine, where a
// reload takes milliseconds.
const waitDeadline = 10 * time.Second

// versionPolicy allows echo with reason "v<n>", so a decision says which version served it.
func versionPolicy(n int) map[string]string {
	return map[string]string{
		"p.rego":    fmt.Sprintf("package sandgate\n\ndecision := {\"allow\": true, \"reason\": \"v%d\"} if input.mcp.tool == \"echo\"\n", n),
		"data.json": fmt.Sprintf(`{"version": %d}`, n),
	}
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, src := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
}

// servedVersion is n of the "v<n>" the policy answers with, or -1.
func servedVersion(e *policy.Engine) int {
	d := e.Decide(context.Background(), callInput("echo"))
	n, err := strconv.Atoi(strings.TrimPrefix(d.Reason, "v"))
	if !d.Allow || err != nil {
		return -1
	}
	return n
}

// fakeClock is a time source the test moves and ticks by hand.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time
	tick chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), tick: make(chan time.Time)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) NewTicker(time.Duration) (<-chan time.Time, func()) { return c.tick, func() {} }

// Tick delivers one periodic check; it returns once Watch has taken it.
func (c *fakeClock) Tick(t *testing.T) {
	t.Helper()
	select {
	case c.tick <- c.Now():
	case <-time.After(waitDeadline):
		t.Fatal("Watch did not take the periodic check's tick")
	}
}

// watched is an engine on dir with Watch running until the test ends. Its periodic check
// ticks only when the test says so, so what the loops show is the file watcher's work.
type watched struct {
	*policy.Engine
	clock   *fakeClock
	reloads chan struct{} // a signal after every reload attempt
	calls   atomic.Int64
}

func startWatch(t *testing.T, dir string, opts ...policy.Option) *watched {
	t.Helper()
	w := &watched{clock: newFakeClock(), reloads: make(chan struct{}, 1)}
	opts = append([]policy.Option{
		policy.WithDebounce(10 * time.Millisecond),
		policy.WithClock(w.clock),
		policy.WithReloadObserver(func(policy.ReloadResult) {
			w.calls.Add(1)
			select {
			case w.reloads <- struct{}{}:
			default:
			}
		}),
	}, opts...)
	e, err := policy.New(context.Background(), dir, opts...)
	require.NoError(t, err)
	w.Engine = e
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Watch(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	// Watch reloads once its watches are set up: from then on every change is seen.
	w.waitFor(t, "the watch to start", func() bool { return w.calls.Load() >= 2 })
	return w
}

// waitFor waits, reload by reload, until cond holds.
func (w *watched) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitDeadline)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-w.reloads:
		case <-deadline.C:
			if !cond() {
				t.Fatalf("waited %s for %s; serving %s, status %+v", waitDeadline, what, w.Revision(), w.Status())
			}
		}
	}
}

// folderUpdate replaces the policy folder's contents with version n, the way one kind of
// deployment does it. setup makes the folder at dir with version 0.
type folderUpdate struct {
	name   string
	setup  func(t testing.TB, dir string)
	update func(t testing.TB, dir string, n int)
}

// configMapWrite writes version n the way kubelet's atomic writer updates a ConfigMap volume:
// a new timestamped folder, a ..data_tmp symlink to it renamed over ..data, the old folder
// removed; the visible files are symlinks through ..data, made once.
func configMapWrite(t testing.TB, dir string, n int) {
	t.Helper()
	files := versionPolicy(n)
	ts := fmt.Sprintf("..2026_11_30_12_%02d_%02d.%09d", n/60%60, n%60, n)
	writeFiles(t, filepath.Join(dir, ts), files)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	require.NoError(t, os.Symlink(ts, filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
		}
	}
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, old)))
	}
}

// symlinkSwap points the symlink dir at a new folder by renaming a new symlink over it, then
// removes the old folder.
func symlinkSwap(t testing.TB, dir string, n int) {
	t.Helper()
	target := fmt.Sprintf("%s.v%d", filepath.Base(dir), n)
	writeFiles(t, filepath.Join(filepath.Dir(dir), target), versionPolicy(n))
	old, _ := os.Readlink(dir)
	require.NoError(t, os.Symlink(target, dir+".tmp"))
	require.NoError(t, os.Rename(dir+".tmp", dir))
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(filepath.Dir(dir), old)))
	}
}

var folderUpdates = []folderUpdate{
	{"ConfigMap volume: ..data symlink swapped to a new timestamped folder",
		func(t testing.TB, dir string) { require.NoError(t, os.Mkdir(dir, 0o755)); configMapWrite(t, dir, 0) },
		configMapWrite},
	{"folder removed (rm -rf) and created again",
		func(t testing.TB, dir string) { writeFiles(t, dir, versionPolicy(0)) },
		func(t testing.TB, dir string, n int) {
			require.NoError(t, os.RemoveAll(dir))
			writeFiles(t, dir, versionPolicy(n))
		}},
	{"new folder moved over the old one (mv old aside, mv new into place)",
		func(t testing.TB, dir string) { writeFiles(t, dir, versionPolicy(0)) },
		func(t testing.TB, dir string, n int) {
			writeFiles(t, dir+".new", versionPolicy(n))
			require.NoError(t, os.Rename(dir, dir+".old"))
			require.NoError(t, os.Rename(dir+".new", dir))
			require.NoError(t, os.RemoveAll(dir+".old"))
		}},
	{"symlinked folder re-pointed by renaming a new symlink over it",
		func(t testing.TB, dir string) { symlinkSwap(t, dir, 0) },
		symlinkSwap},
}

// Each way of replacing the policy folder, 100 times in a row, while decisions are made
// concurrently: every replacement is served, and no decision in between is anything but an
// answer of the policy (no engine denial, no version going backwards).
func TestWatchFollowsTheFolderWhenItIsReplaced(t *testing.T) {
	const iterations = 100
	for _, u := range folderUpdates {
		t.Run(u.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "policies")
			u.setup(t, dir)
			w := startWatch(t, dir)
			require.Equal(t, 0, servedVersion(w.Engine))

			stop := make(chan struct{})
			var decisions atomic.Int64
			var bad atomic.Value
			var wg sync.WaitGroup
			wg.Go(func() {
				last := 0
				for {
					select {
					case <-stop:
						return
					default:
					}
					d := w.Decide(context.Background(), callInput("echo"))
					decisions.Add(1)
					n, err := strconv.Atoi(strings.TrimPrefix(d.Reason, "v"))
					if !d.Allow || err != nil || n < last {
						bad.CompareAndSwap(nil, fmt.Sprintf("after v%d: allow=%v code=%s reason=%q", last, d.Allow, d.Code, d.Reason))
						return
					}
					last = n
					// Pacing, not synchronisation: decisions keep coming throughout without this
					// goroutine taking a whole core from the watcher on a 2-core machine.
					time.Sleep(200 * time.Microsecond)
				}
			})

			start := time.Now()
			for n := 1; n <= iterations; n++ {
				u.update(t, dir, n)
				w.waitFor(t, fmt.Sprintf("version %d to be served", n), func() bool { return servedVersion(w.Engine) == n })
			}
			elapsed := time.Since(start)
			close(stop)
			wg.Wait()
			require.Nil(t, bad.Load(), "a decision during the replacements")
			w.waitFor(t, "the last reload to succeed", func() bool { return !w.Status().Degraded() })
			t.Logf("%d replacements served in %v (%v each), %d concurrent decisions", iterations, elapsed.Round(time.Millisecond), (elapsed / iterations).Round(time.Microsecond), decisions.Load())
		})
	}
}

// A change the file watcher cannot see (here a symlink higher up the path re-pointed, in a
// folder nobody watches) is found by the periodic content check; after it the watch follows
// the new folder.
func TestWatchPeriodicCheckFindsWhatTheWatcherMissed(t *testing.T) {
	base := t.TempDir()
	writeFiles(t, filepath.Join(base, "a", "policies"), versionPolicy(0))
	writeFiles(t, filepath.Join(base, "b", "policies"), versionPolicy(1))
	require.NoError(t, os.Symlink("a", filepath.Join(base, "current")))
	var logs syncBuffer
	w := startWatch(t, filepath.Join(base, "current", "policies"),
		policy.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Equal(t, 0, servedVersion(w.Engine))

	require.NoError(t, os.Symlink("b", filepath.Join(base, "next")))
	require.NoError(t, os.Rename(filepath.Join(base, "next"), filepath.Join(base, "current")))
	w.clock.Tick(t)
	w.waitFor(t, "the periodic check to load version 1", func() bool { return servedVersion(w.Engine) == 1 })
	assert.Contains(t, logs.String(), "policy change found by the periodic check")

	writeFiles(t, filepath.Join(base, "b", "policies"), versionPolicy(2))
	w.waitFor(t, "the watcher to see an edit in the new folder", func() bool { return servedVersion(w.Engine) == 2 })
}

// A reload that fails keeps the last good revision serving and shows: Status is degraded with
// the error, the failure is counted by reason, and the revision's age keeps growing until a
// reload succeeds.
func TestReloadFailureIsVisible(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	dir := filepath.Join(t.TempDir(), "policies")
	writeFiles(t, dir, versionPolicy(0))
	w := startWatch(t, dir, policy.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	good := w.Revision()
	loadedAt := w.clock.Now()
	require.False(t, w.Status().Degraded())
	assert.Equal(t, loadedAt, w.Status().LoadedAt)

	writeFiles(t, dir, map[string]string{"p.rego": "package sandgate\n\ndecision := {\"allow\": \n"})
	w.waitFor(t, "the broken edit to be rejected", func() bool { return w.Status().ReloadErr != nil })
	s := w.Status()
	assert.True(t, s.Degraded())
	assert.Equal(t, good, s.Revision, "the last good revision keeps serving")
	assert.Equal(t, 0, servedVersion(w.Engine))
	assert.Contains(t, s.Problem(), "p.rego:")
	w.clock.Advance(90 * time.Second)
	m := collect(t, reader)
	assert.GreaterOrEqual(t, m.counter["sandgate.policy.reload.failures/reason=compile"], int64(1))
	assert.Equal(t, 1.0, m.gauge["sandgate.policy.reload.degraded"])
	assert.Equal(t, 90.0, m.gauge["sandgate.policy.revision.age"])
	assert.Equal(t, float64(loadedAt.Unix()), m.gauge["sandgate.policy.reload.last_success"])

	require.NoError(t, os.RemoveAll(dir))
	w.waitFor(t, "the removed folder to be reported", func() bool {
		return collect(t, reader).counter["sandgate.policy.reload.failures/reason=read"] >= 1
	})
	assert.Contains(t, w.Status().Problem(), "no such file or directory")
	assert.Equal(t, 0, servedVersion(w.Engine), "the last good revision keeps serving")

	writeFiles(t, dir, versionPolicy(1))
	w.waitFor(t, "the repaired folder to be served", func() bool { return servedVersion(w.Engine) == 1 && !w.Status().Degraded() })
	m = collect(t, reader)
	assert.Equal(t, 0.0, m.gauge["sandgate.policy.reload.degraded"])
	assert.Equal(t, 0.0, m.gauge["sandgate.policy.revision.age"])
	assert.Equal(t, float64(w.clock.Now().Unix()), m.gauge["sandgate.policy.reload.last_success"])
	assert.Empty(t, w.Status().Problem())
}

// Removing the file that broke a reload brings back exactly the serving revision: nothing new is
// compiled, but the engine is no longer degraded, and the log says so (the failure was logged;
// an operator watching the log must see it end).
func TestRecoveryToTheServingRevisionIsLogged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFiles(t, dir, versionPolicy(0))
	var logs syncBuffer
	e, err := policy.New(ctx, dir, policy.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	good := e.Revision()

	writeFiles(t, dir, map[string]string{"broken.rego": "package sandgate\n\ndecision := {\"allow\": \n"})
	require.Error(t, e.Reload(ctx))
	require.True(t, e.Status().Degraded())

	require.NoError(t, os.Remove(filepath.Join(dir, "broken.rego")))
	require.NoError(t, e.Reload(ctx))
	assert.False(t, e.Status().Degraded())
	assert.Equal(t, good, e.Revision())
	assert.Contains(t, logs.String(), "policy reload recovered")
	assert.Contains(t, logs.String(), "revision="+good)
}

// metricValues are the policy metrics by name (and "/key=value" for one attribute).
type metricValues struct {
	counter map[string]int64
	gauge   map[string]float64
}

func collect(t testing.TB, reader sdkmetric.Reader) metricValues {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	v := metricValues{counter: map[string]int64{}, gauge: map[string]float64{}}
	key := func(name string, attrs attribute.Set) string {
		if kv, ok := attrs.Get(0); ok && attrs.Len() == 1 {
			return name + "/" + string(kv.Key) + "=" + kv.Value.String()
		}
		return name
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					v.counter[key(m.Name, dp.Attributes)] += dp.Value
				}
			case metricdata.Gauge[float64]:
				for _, dp := range data.DataPoints {
					v.gauge[key(m.Name, dp.Attributes)] = dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					v.gauge[key(m.Name, dp.Attributes)] = float64(dp.Value)
				}
			}
		}
	}
	return v
}

// syncBuffer is a log destination safe for the watcher writing while the test reads.
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
