package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch keeps the serving revision in step with the policy folder until ctx ends.
//
// It follows the folder by its name, not by the inode it had at start. It watches the folder's
// parent (so a folder removed and created again, a folder renamed over it, or a symlink to it
// re-pointed are seen) and every folder the engine reads, through symlinks as loading does. After
// each burst of changes (debounced, WithDebounce) it resolves the name again, watches what it now
// names, and reloads. A Kubernetes ConfigMap volume's update (a new timestamped folder, ..data
// re-pointed to it by a rename, the old folder removed) is a change in the folder itself.
//
// As a backstop for what a file watcher cannot see (a symlink higher up the path re-pointed,
// events lost) it hashes the folder's contents every poll interval (WithPollInterval) and
// reloads when they differ from the last reading.
//
// Watch returns only when ctx ends: a watcher that cannot be set up leaves the engine degraded
// (Status, metrics, log) while the periodic check carries on, and every later pass retries it.
func (e *Engine) Watch(ctx context.Context) error {
	fw := newFolderWatch(e.dir)
	defer fw.close()
	e.setWatchErr(fw.resync())
	_ = e.Reload(ctx) // a change made between New and the watch starting
	var tick <-chan time.Time
	if e.poll > 0 {
		t, stop := e.clock.NewTicker(e.poll)
		defer stop()
		tick = t
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.events():
			if !ok {
				fw.lost()
				e.setWatchErr(errors.New("the file watcher stopped"))
				continue
			}
			if fw.concerns(ev) {
				debounce.Reset(e.debounce)
			}
		case err, ok := <-fw.errors():
			if ok {
				if errors.Is(err, syscall.EINVAL) {
					// fsnotify reports inotify_rm_watch's EINVAL for a watched folder that was
					// deleted (mv old aside, rm -rf): the kernel dropped the watch already. Not
					// a failure (it raised reload-failure alerts on every mv-over): the
					// deletion is an event of its own, and the pass below rebuilds the watch.
					e.log.Debug("policy watch: a watched folder went away", "dir", e.dir, "err", err)
				} else {
					// Events may be lost (a queue overflow): look again as after a change.
					e.watchFailed(err)
				}
				debounce.Reset(e.debounce)
			}
		case <-debounce.C:
			e.follow(ctx, fw)
		case <-tick:
			switch {
			case e.folderChanged():
				e.log.Warn("policy change found by the periodic check, not the file watcher", "dir", e.dir)
				e.follow(ctx, fw)
			case e.Status().WatchErr != nil:
				e.setWatchErr(fw.resync())
			}
		}
	}
}

// follow watches what the folder's name resolves to now, then reloads: a change after the
// watch is set up is seen by it, one before is read by the reload.
func (e *Engine) follow(ctx context.Context, fw *folderWatch) {
	e.setWatchErr(fw.resync())
	_ = e.Reload(ctx) // logged, counted and kept in Status inside
}

// folderWatch is the file watcher of one policy folder, rebuilt on every pass so that no watch
// is left on an inode the folder's name no longer leads to.
type folderWatch struct {
	dir    string // cleaned
	parent string // "" when the folder has none to watch ("/", ".")
	w      *fsnotify.Watcher
}

func newFolderWatch(dir string) *folderWatch {
	fw := &folderWatch{dir: filepath.Clean(dir)}
	if p := filepath.Dir(fw.dir); p != fw.dir {
		fw.parent = p
	}
	return fw
}

// resync replaces the watcher with one on the parent and on every folder the engine reads now.
// A folder that is missing or unreadable is not the watcher's failure: the reload reports it, and
// the parent's watch sees it come back.
func (fw *folderWatch) resync() error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch policies in %s: %w", fw.dir, err)
	}
	var errs []error
	if fw.parent != "" {
		if err := w.Add(fw.parent); err != nil {
			errs = append(errs, fmt.Errorf("watch %s: %w", fw.parent, err))
		}
	}
	_ = walkServed(fw.dir, func(_, abs string, info fs.FileInfo) error {
		if info.IsDir() {
			// A folder gone since the walk saw it was changed under us: its removal is an event.
			if err := w.Add(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("watch %s: %w", abs, err))
			}
		}
		return nil
	})
	fw.close()
	fw.w = w
	return errors.Join(errs...)
}

// concerns reports whether an event may change what is served: anything in the watched folders,
// but in the parent only what names the policy folder (its siblings are not policy).
func (fw *folderWatch) concerns(ev fsnotify.Event) bool {
	name := filepath.Clean(ev.Name)
	return fw.parent == "" || filepath.Dir(name) != fw.parent || name == fw.dir
}

func (fw *folderWatch) events() <-chan fsnotify.Event {
	if fw.w == nil {
		return nil
	}
	return fw.w.Events
}

func (fw *folderWatch) errors() <-chan error {
	if fw.w == nil {
		return nil
	}
	return fw.w.Errors
}

// lost drops a watcher whose channels closed; the next resync builds another.
func (fw *folderWatch) lost() {
	fw.close()
	fw.w = nil
}

// close stops the watcher. fsnotify (v1.10.1, inotify) holds the lock Close takes while it
// sends an error, and the watch loop, the channels' only reader, is the caller here: a watched
// folder moved aside and deleted (its watch already gone, so removing it fails) left the loop
// blocked in Close for good, and policy changes unseen. The channels are drained until the
// watcher closes them, which it does once Close has stopped it.
func (fw *folderWatch) close() {
	if fw.w == nil {
		return
	}
	go drainWatcher(fw.w)
	_ = fw.w.Close()
}

func drainWatcher(w *fsnotify.Watcher) {
	events, errs := w.Events, w.Errors
	for events != nil || errs != nil {
		select {
		case _, ok := <-events:
			if !ok {
				events = nil
			}
		case _, ok := <-errs:
			if !ok {
				errs = nil
			}
		}
	}
}
