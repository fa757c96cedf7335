package policy

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch reloads the policies whenever a file under the folder changes, until ctx ends. Changes
// are debounced so that an editor's write-rename-chmod, or a ConfigMap's atomic symlink swap,
// cause one reload. New subfolders are watched as they appear.
func (e *Engine) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch policies: %w", err)
	}
	defer w.Close()
	if err := addTree(w, e.dir); err != nil {
		return fmt.Errorf("watch policies in %s: %w", e.dir, err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) {
				_ = addTree(w, ev.Name) // a new subfolder; a file is not a folder and is skipped
			}
			timer.Reset(e.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			e.log.Warn("policy watch error", "dir", e.dir, "err", err)
		case <-timer.C:
			_ = e.Reload(ctx) // logged and observed inside; a failure keeps the last revision
		}
	}
}

func addTree(w *fsnotify.Watcher, root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root && strings.HasPrefix(d.Name(), ".") && !strings.HasPrefix(d.Name(), "..") {
			return filepath.SkipDir
		}
		return w.Add(path)
	})
}
