package policy

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Reasons a reload attempt or the watch failed: ReloadResult.Reason and the `reason` label of
// the reload failure counter.
const (
	ReloadReadError    = "read"      // the folder is missing, not a folder, or a file cannot be read
	ReloadCompileError = "compile"   // a file does not parse or compile, or no decision rule
	ReloadNoPolicy     = "no_policy" // the folder holds no .rego file
	ReloadWatchError   = "watch"     // the file watcher failed; only the periodic check finds changes
	ReloadBundleError  = "bundle"    // a bundle could not be fetched or read
	ReloadSignature    = "signature" // a bundle is unsigned or its signature does not verify
)

// DefaultPollInterval is how often Watch hashes the folder's contents as a backstop.
const DefaultPollInterval = 10 * time.Second

// ReloadStatus is the state of hot reload: what serves, since when, and whether the engine is
// degraded, that is serving its last good revision while the folder holds something it cannot
// load, or while the folder cannot be watched.
type ReloadStatus struct {
	Revision    string
	LoadedAt    time.Time // when the serving revision was installed (zero: none is)
	LastSuccess time.Time // the last reload attempt that succeeded, whether or not it changed anything
	ReloadErr   error     // why the last reload attempt failed (nil: it did not)
	WatchErr    error     // why the folder is not fully watched (nil: it is, or Watch is not running)
}

// Degraded reports whether the last reload failed or the watch is broken. The engine still
// serves its last good revision (if it has one).
func (s ReloadStatus) Degraded() bool { return s.ReloadErr != nil || s.WatchErr != nil }

// Problem says what is wrong, for readiness reports; "" when not degraded.
func (s ReloadStatus) Problem() string {
	var parts []string
	if s.ReloadErr != nil {
		parts = append(parts, "reload failed: "+s.ReloadErr.Error())
	}
	if s.WatchErr != nil {
		parts = append(parts, "watch failed (changes are found only by the periodic check): "+s.WatchErr.Error())
	}
	return strings.Join(parts, "; ")
}

// reloadState is the bookkeeping behind ReloadStatus (Engine.stateMu).
type reloadState struct {
	lastSuccess time.Time
	reloadErr   error
	watchErr    error
	// reading identifies the folder's contents at the last reload attempt (their revision hash,
	// or the read error), for Watch's periodic check.
	reading string
}

// Clock is the time source of reload bookkeeping and of Watch's periodic check.
type Clock interface {
	Now() time.Time
	// NewTicker delivers the time every d until stop is called.
	NewTicker(d time.Duration) (tick <-chan time.Time, stop func())
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// Status reports the state of hot reload.
func (e *Engine) Status() ReloadStatus {
	s := ReloadStatus{Revision: noRevision}
	if r := e.cur.Load(); r != nil {
		s.Revision, s.LoadedAt = r.id, r.loadedAt
	}
	e.stateMu.Lock()
	s.LastSuccess, s.ReloadErr, s.WatchErr = e.state.lastSuccess, e.state.reloadErr, e.state.watchErr
	e.stateMu.Unlock()
	return s
}

// Reload reads and compiles the folder again (for an engine serving a bundle: looks at the
// bundle again). On failure the last good revision keeps serving, the error says why, and
// Status reports the engine degraded until a reload succeeds; a folder emptied of policies also
// keeps the last revision. Files identical to the serving revision are not compiled again.
func (e *Engine) Reload(ctx context.Context) error {
	if e.bundle != nil {
		return e.bundle.Poll(ctx)
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	prev := e.cur.Load()
	var rev *revision
	reason := ""
	files, err := readPolicyFiles(e.dir)
	reading := readingOf(files, err)
	switch {
	case err != nil:
		reason = ReloadReadError
	case prev != nil && prev.id == reading:
		// unchanged: an event that changed nothing served (an editor's swap file, a chmod)
	default:
		if rev, err = compile(ctx, e.dir, files, e.cacheMax); err != nil {
			reason = ReloadCompileError
			if errors.Is(err, ErrNoPolicy) {
				reason = ReloadNoPolicy
			}
		}
	}
	return e.settle(prev, rev, err, reason, reading)
}

// settle installs rev (nil: nothing new) after one reload attempt and does its bookkeeping:
// status, log, metrics and the observer. The caller holds reloadMu.
func (e *Engine) settle(prev, rev *revision, err error, reason, reading string) error {
	now := e.clock.Now()
	res := ReloadResult{Err: err, Reason: reason, Revision: e.Revision()}
	if rev != nil {
		rev.loadedAt = now
		e.cur.Store(rev)
		res.Revision, res.Changed = rev.id, true
	}
	e.stateMu.Lock()
	failed := e.state.reloadErr != nil
	e.state.reading, e.state.reloadErr = reading, err
	if err == nil {
		e.state.lastSuccess = now
	}
	e.stateMu.Unlock()

	switch {
	case err != nil && prev == nil:
		// Nothing compiled yet: there is no good revision to fall back on, and every call is
		// denied until the folder compiles (at start, serve refuses to run on it).
		e.log.Error("policy load rejected; no revision serves: every call is denied until the policies compile",
			"dir", e.dir, "reason", reason, "err", err)
	case err != nil:
		e.log.Error("policy reload rejected; last good revision keeps serving", "dir", e.dir, "revision", res.Revision, "reason", reason, "err", err)
	case res.Changed:
		old := noRevision
		if prev != nil {
			old = prev.id
		}
		e.log.Info("policy loaded", "dir", e.dir, "revision", rev.id, "previous", old, "files", len(rev.files))
	case failed:
		// The folder is back to what serves (the broken file removed): nothing to load, but
		// the failure logged before is over.
		e.log.Info("policy reload recovered; the folder holds the serving revision again", "dir", e.dir, "revision", res.Revision)
	}
	e.metrics.reloaded(res)
	if e.onReload != nil {
		e.onReload(res)
	}
	return err
}

// readingOf identifies one reading of the folder: its revision, or why it could not be read.
func readingOf(files policyFiles, err error) string {
	if err != nil {
		return "unreadable: " + err.Error()
	}
	return files.revision()
}

// folderChanged reads the folder and reports whether it differs from the last reload attempt's
// reading (Watch's backstop).
func (e *Engine) folderChanged() bool {
	files, err := readPolicyFiles(e.dir)
	reading := readingOf(files, err)
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	return reading != e.state.reading
}

// setWatchErr records the outcome of setting up the watch (nil: the folder is watched again).
func (e *Engine) setWatchErr(err error) {
	e.stateMu.Lock()
	prev := e.state.watchErr
	e.state.watchErr = err
	e.stateMu.Unlock()
	switch {
	case err != nil:
		e.watchFailed(err)
	case prev != nil:
		e.log.Info("policy folder watched again", "dir", e.dir)
	}
}

// watchFailed logs and counts one failure of the watcher.
func (e *Engine) watchFailed(err error) {
	e.log.Error("policy watch failed; changes are found by the periodic check until it recovers", "dir", e.dir, "poll_interval", e.poll, "err", err)
	e.metrics.reloadFailed(ReloadWatchError)
}
