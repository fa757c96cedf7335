package audit

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// An audit folder has one writer. Two processes appending to one audit.log would each continue
// the chain from the line they last saw, interleaving two chains that no verification can tell
// from an edited log, and each would heal, rotate and truncate the file under the other. So the
// FileSink takes the folder before it reads or changes anything in it: an exclusive flock(2) on
// LockFile, which the kernel releases when the process ends however it ends (a SIGKILL, an OOM
// kill), so a replica killed at any instant never leaves a lock behind. Over NFS the Linux
// client turns the flock into a lock the server holds, released when the process ends or, if its
// host dies, when the host's lease runs out. The holder writes who it is into the file after it
// took the lock; a process refused reads it back to name the holder. The file's content is only
// a name: the lock is what counts, and a file left with an old holder's name is simply taken.

// LockFile, in the audit folder, is locked by the process that writes the folder's log.
const LockFile = "audit.lock"

// Holder is who holds an audit folder, as it wrote into LockFile.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	// Folder names the folder's log for as long as the lock file lasts: each holder keeps the
	// one it found (a new one when there is none). The Redis Stream mirror leases the replica's
	// stream under it, so that a restart over the same folder continues its stream at once.
	Folder string `json:"folder"`
}

func (h *Holder) String() string {
	if h == nil {
		return "a process that has not written its name yet (it may be starting)"
	}
	return fmt.Sprintf("pid %d on host %s, since %s", h.PID, h.Host, h.Started.UTC().Format(time.RFC3339))
}

// mayRun reports that the holder may be running: false only for a process of this host that is
// gone (a name left by a holder killed before, read while the new holder is between taking the
// lock and writing its name).
func (h *Holder) mayRun() bool {
	if h == nil {
		return false
	}
	host, _ := os.Hostname()
	if h.Host != host {
		return true
	}
	return !errors.Is(syscall.Kill(h.PID, 0), syscall.ESRCH)
}

// FolderTakenError is OpenFileSink's answer when another process holds the audit folder.
type FolderTakenError struct {
	Dir string
	// Holder is who holds it; nil when it has not written its name (yet).
	Holder *Holder
}

func (e *FolderTakenError) Error() string {
	return fmt.Sprintf("audit folder %s is already taken by another Sandgate (%s): one folder has one writer, "+
		"or its log would fork into two chains. Stop that process, or give this one an audit.file.dir of its own "+
		"(each replica needs its own folder)", e.Dir, e.Holder)
}

// folderLock is a held LockFile.
type folderLock struct {
	path string
	f    *os.File
	fi   os.FileInfo // the locked file, to notice it removed or replaced (check)
}

// lockFolder takes dir's LockFile, or says who holds it (*FolderTakenError). The file descriptor
// is close-on-exec (Go opens every file so): a child process (a stdio upstream) never inherits
// the lock and keeps it past this process.
func lockFolder(dir string) (*folderLock, error) {
	path := filepath.Join(dir, LockFile)
	for range 3 {
		l, err := tryLock(path)
		if !errors.Is(err, errLockMoved) {
			if err == nil {
				// The name is only for the refusals of others: a folder on a full disk (a
				// Sandgate started there starts unready, and serves again once space is freed)
				// is held all the same, its holder unnamed.
				_ = l.writeHolder()
			}
			return l, err
		}
	}
	return nil, fmt.Errorf("lock the audit folder: %s was replaced three times while it was being locked: "+
		"is another process removing it?", path)
}

// errLockMoved says the file locked is no longer the one under LockFile's name: it was removed,
// or replaced, between the open and the lock, so another process may lock the new one.
var errLockMoved = errors.New("lock file replaced while it was locked")

func tryLock(path string) (*folderLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the audit folder: %w", err)
	}
	if err := flock(f); err != nil {
		holder := readHolder(f)
		f.Close()
		if !holder.mayRun() {
			holder = nil // an earlier holder's name: the holder now has not written its own yet
		}
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &FolderTakenError{Dir: filepath.Dir(path), Holder: holder}
		}
		return nil, fmt.Errorf("lock the audit folder with flock(2) on %s: %w (the audit folder must be on a "+
			"file system that supports locks, so that no two processes write one log)", path, err)
	}
	l := &folderLock{path: path, f: f}
	if l.fi, err = f.Stat(); err != nil {
		l.release()
		return nil, fmt.Errorf("lock the audit folder: %w", err)
	}
	named, err := os.Stat(path)
	if err != nil || !os.SameFile(l.fi, named) {
		l.release()
		return nil, errLockMoved
	}
	return l, nil
}

// flock takes f's exclusive lock without waiting.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// writeHolder replaces the file's content with this process's name, keeping the folder's.
func (l *folderLock) writeHolder() error {
	host, _ := os.Hostname()
	h := Holder{PID: os.Getpid(), Host: host, Started: time.Now().UTC()}
	if before := readHolder(l.f); before != nil && before.Folder != "" {
		h.Folder = before.Folder
	} else {
		var id [12]byte
		_, _ = rand.Read(id[:])
		h.Folder = hex.EncodeToString(id[:])
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("write the holder of %s: %w", l.path, err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("write the holder of %s: %w", l.path, err)
	}
	return nil
}

// readHolder reads the holder's name from a lock file, nil when there is none that parses (the
// holder is between taking the lock and writing its name).
func readHolder(f *os.File) *Holder {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 4096))
	if err != nil {
		return nil
	}
	var h Holder
	if json.Unmarshal(b, &h) != nil || h.PID == 0 {
		return nil
	}
	return &h
}

// check reports a lock file removed or replaced under the holder: another process could then
// lock a new file of that name and write the folder too. An fstat (the file's link count: 0.45
// µs, BenchmarkFolderLockCheck on the 2-core test VM), cheap enough for every batch; the name
// itself is compared when named is set.
func (l *folderLock) check(named bool) error {
	if l == nil {
		return nil // a sink opened without the lock (tests of what two writers leave)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(l.f.Fd()), &st); err != nil {
		return fmt.Errorf("audit lock %s: %w", l.path, err)
	}
	if st.Nlink > 0 && !named {
		return nil
	}
	fi, err := os.Stat(l.path)
	if st.Nlink == 0 || err != nil || !os.SameFile(l.fi, fi) {
		return fmt.Errorf("audit lock %s was removed or replaced: another process could take the audit folder "+
			"and write into its log; no more events are written here: restart Sandgate to take the folder again", l.path)
	}
	return nil
}

// release unlocks (by closing: the lock belongs to the open file). The file stays: removing it
// would let a process that opened it before the removal lock a file no longer named.
func (l *folderLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
