package policy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
)

// A policy folder moved aside and deleted: fsnotify, handling the move after the kernel has
// dropped the folder's watch, fails to remove it and sends that error while holding the lock
// its Close takes. The watch loop, the only reader of the error, is then inside close (its
// resync after the change): close must return all the same. Before the fix this hung for good,
// in a cold `make test` (TestWatchFollowsTheFolderWhenItIsReplaced, 5 minutes in Close); how
// often a single round reaches that state depends on scheduling, hence the rounds.
func TestFolderWatchClosesWithAnErrorPending(t *testing.T) {
	for round := range 20 {
		parent := t.TempDir()
		dir := filepath.Join(parent, "policies")
		require.NoError(t, os.Mkdir(dir, 0o755))
		fw := newFolderWatch(dir)
		require.NoError(t, fw.resync())

		require.NoError(t, os.Rename(dir, dir+".old"))
		require.NoError(t, os.RemoveAll(dir+".old"))
		// The parent's two events for the move, read as the loop reads them; after them
		// fsnotify handles the folder's own move and blocks sending the error nobody reads.
		for seen := 0; seen < 2; {
			select {
			case ev := <-fw.events():
				if filepath.Dir(ev.Name) == parent && ev.Op&(fsnotify.Rename|fsnotify.Create) != 0 {
					seen++
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: no event for the folder's move", round)
			}
		}

		closed := make(chan struct{})
		go func() { fw.close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: close did not return with an fsnotify error pending", round)
		}
	}
}
