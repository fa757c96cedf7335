package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/config"
)

// FsyncMode says when the FileSink forces written events to disk.
type FsyncMode string

const (
	// FsyncBatch syncs at most every FsyncInterval while there are unsynced writes, and on Close.
	FsyncBatch FsyncMode = "batch"
	// FsyncAlways syncs every batch before WriteBatch returns.
	FsyncAlways FsyncMode = "always"
	// FsyncNever leaves it to the operating system (and still syncs on Close).
	FsyncNever FsyncMode = "never"
)

// FileConfig configures a FileSink. Zero values take the defaults.
type FileConfig struct {
	// Dir receives audit.log and the rotated files. It is created with mode 0700.
	Dir string
	// MaxSize in bytes rotates audit.log before a batch would grow it past this size (default
	// 64 MiB). A batch is never split, so a file exceeds MaxSize only by holding a single batch
	// larger than MaxSize.
	MaxSize int64
	// Fsync is the fsync mode (default FsyncBatch).
	Fsync FsyncMode
	// FsyncInterval is the batch mode's bound on how long a write stays unsynced (default 100ms).
	FsyncInterval time.Duration
	// Reserve is the disk space, in bytes, kept aside in Dir/audit.reserve so that the events
	// of calls already admitted are written when the disk fills up (reserve.go). 0 keeps none;
	// otherwise at least MinReserve.
	Reserve int64

	// nameCheckEvery is how often a batch also looks audit.log up by its name (checkFile);
	// tests shorten or lengthen it. Default defaultNameCheckEvery.
	nameCheckEvery time.Duration
}

// defaultNameCheckEvery is how often the sink looks its file up by name when nothing else asks
// it to (checkFile).
const defaultNameCheckEvery = time.Second

// FileConfigFrom translates the config file's audit.file section.
func FileConfigFrom(c config.AuditFile) (FileConfig, error) {
	fc := FileConfig{
		Dir:           c.Dir,
		MaxSize:       int64(c.MaxSizeMB) << 20,
		Fsync:         FsyncMode(c.Fsync),
		FsyncInterval: c.FsyncInterval.D(),
		Reserve:       int64(c.ReserveMB) << 20,
	}
	return fc, fc.withDefaults().validate()
}

func (c FileConfig) withDefaults() FileConfig {
	if c.MaxSize == 0 {
		c.MaxSize = 64 << 20
	}
	if c.Fsync == "" {
		c.Fsync = FsyncBatch
	}
	if c.FsyncInterval == 0 {
		c.FsyncInterval = 100 * time.Millisecond
	}
	if c.nameCheckEvery == 0 {
		c.nameCheckEvery = defaultNameCheckEvery
	}
	return c
}

func (c FileConfig) validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("audit.file.dir: must not be empty"))
	}
	if c.MaxSize < 0 {
		errs = append(errs, fmt.Errorf("audit.file.max_size_mb: must be positive, got %d bytes", c.MaxSize))
	}
	switch c.Fsync {
	case FsyncBatch, FsyncAlways, FsyncNever:
	default:
		errs = append(errs, fmt.Errorf("audit.file.fsync: %q is not one of batch, always, never", c.Fsync))
	}
	if c.Reserve != 0 && c.Reserve < MinReserve {
		errs = append(errs, fmt.Errorf("audit.file.reserve_mb: must be at least %d bytes, got %d", MinReserve, c.Reserve))
	}
	if c.FsyncInterval < 0 {
		errs = append(errs, fmt.Errorf("audit.file.fsync_interval: must not be negative, got %s", c.FsyncInterval))
	}
	return errors.Join(errs...)
}

// FileSink appends JSON lines to Dir/audit.log and rotates it by size. Files are created with mode
// 0600. A write that fails is undone (the file is truncated back) so the Writer can retry it; if
// it cannot be undone, or an fsync fails, the sink fails every later write.
//
// Before each batch the sink checks that Dir/audit.log is still the file it has open, so a removed
// or replaced file or directory is reported rather than written into an unlinked inode
// (checkFile).
type FileSink struct {
	cfg      FileConfig
	path     string
	lastHash string

	mu          sync.Mutex
	f           *os.File    // nil after a rotation whose reopen failed
	fd          int         // f's descriptor, for checkFile's fstat
	fi          os.FileInfo // f's identity, taken when it was opened
	namedAt     time.Time   // when checkFile last found f under its name
	size        int64
	dirty       bool
	broken      error
	closed      bool
	lastRotated time.Time
	buf         []byte
	reserve     *os.File // Dir/audit.reserve, nil without a reserve
	reserveSize int64    // its allocated size now; below cfg.Reserve after a draw
	recovered   *Recovery
	lock        *folderLock // the folder's LockFile, held until Close (lock.go)

	stop chan struct{}
	done chan struct{}
}

// OpenFileSink creates Dir if needed and takes it (lock.go: another process holding it is a
// *FolderTakenError that names it), heals a torn tail of audit.log (recover.go: the tail is
// kept in a file beside the log, Recovered says what was cut), opens audit.log for appending and
// reads the last event's hash so the chain continues.
func OpenFileSink(cfg FileConfig) (*FileSink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("open audit file sink: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create audit dir: %w", err)
	}
	lock, err := lockFolder(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s, err := openLocked(cfg, lock)
	if err != nil {
		lock.release()
		return nil, err
	}
	return s, nil
}

// openLocked opens the sink of a folder this process holds.
func openLocked(cfg FileConfig, lock *folderLock) (*FileSink, error) {
	s := &FileSink{cfg: cfg, path: filepath.Join(cfg.Dir, ActiveFile), lock: lock}

	files, err := logFiles(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, p := range files {
		if t, ok := parseRotatedName(filepath.Base(p)); ok && t.After(s.lastRotated) {
			s.lastRotated = t
		}
	}
	if s.recovered, err = healTail(s.path); err != nil {
		return nil, err
	}
	if err := checkOneWriter(cfg.Dir, files); err != nil {
		return nil, err
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	if err := s.openReserve(); err != nil {
		s.f.Close()
		return nil, err
	}
	// The newest event is in audit.log, or in the newest rotated file when audit.log is empty
	// (a crash between rotation and the first write, or between rename and create).
	for i := len(files) - 1; i >= 0 && s.lastHash == ""; i-- {
		h, err := lastLineHash(files[i])
		if err != nil {
			s.f.Close()
			s.closeReserve()
			return nil, err
		}
		s.lastHash = h
	}
	if cfg.Fsync == FsyncBatch {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.syncLoop()
	}
	return s, nil
}

// open opens (creating) the active file. Caller holds mu or owns s exclusively.
func (s *FileSink) open() error {
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open audit log: %w", err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("open audit log: %w", err)
	}
	s.f, s.fd, s.fi, s.size = f, int(f.Fd()), fi, fi.Size()
	s.namedAt = time.Now()
	return nil
}

// LastHash returns the hash of the newest event found when the sink was opened.
func (s *FileSink) LastHash() (string, error) { return s.lastHash, nil }

// WriteBatch appends the batch's lines, rotating first if they would grow audit.log past MaxSize.
func (s *FileSink) WriteBatch(b *Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("audit file sink is closed")
	case s.broken != nil:
		return s.broken
	}
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	if err := s.checkFile(); err != nil {
		return err
	}
	data := s.buf[:0]
	for _, l := range b.Lines {
		data = append(data, l...)
		data = append(data, '\n')
	}
	s.buf = data
	if s.size > 0 && s.size+int64(len(data)) > s.cfg.MaxSize {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	if err := s.appendData(data); err != nil {
		// A full disk: the lines the writer owes are written in space drawn from the reserve.
		if !errors.Is(err, syscall.ENOSPC) || s.broken != nil || !s.draw(int64(len(data))) {
			return fmt.Errorf("append %d events to %s: %w", len(b.Lines), s.path, err)
		}
		if err := s.appendData(data); err != nil {
			return fmt.Errorf("append %d events to %s from the reserve: %w", len(b.Lines), s.path, err)
		}
	}
	s.size += int64(len(data))
	switch s.cfg.Fsync {
	case FsyncAlways:
		if err := s.f.Sync(); err != nil {
			err = fmt.Errorf("fsync %s: %w", s.path, err)
			s.undo(err)
			s.broken = err // after a failed fsync the page cache cannot be trusted
			return err
		}
	case FsyncBatch:
		s.dirty = true
	}
	return nil
}

// appendData appends data to the active file, undoing a partial write.
func (s *FileSink) appendData(data []byte) error {
	n, err := s.f.Write(data)
	if err != nil && n > 0 {
		s.undo(err)
	}
	return err
}

// undo truncates a partly written batch away so a retry does not store it twice.
func (s *FileSink) undo(cause error) {
	if err := s.f.Truncate(s.size); err != nil {
		s.broken = fmt.Errorf("%w; truncating the partial write failed too, so no more events are appended: %w", cause, err)
	}
}

// checkFile makes sure audit.log is still the open file, so that a removed or replaced log is
// reported rather than written into an unlinked inode. Before each batch it asks the open file
// how many names it has (fstat, 0.6 µs): removed, or replaced by a file renamed over it, it has
// none. The name is looked up (stat, 2.2 µs: as much as the write of the batch itself, which
// under blocking delivery holds one or two events) only then, to tell the two apart, and once
// every nameCheckEvery otherwise: that also reports a log renamed away, whose events are then
// in the file under its new name, not lost. (Both figures by a `go test -bench` of the two
// calls on the 2-core ext4 bench VM; a stat per batch was 1.6 µs of an intercepted request's
// CPU in a pprof of the bench's intercept cell.) The folder's lock file gets the same two
// checks (folderLock.check): removed or replaced, another process could take the folder.
func (s *FileSink) checkFile() error {
	var st syscall.Stat_t
	if err := syscall.Fstat(s.fd, &st); err != nil {
		return fmt.Errorf("audit log %s: %w", s.path, err)
	}
	now := time.Now()
	byName := st.Nlink == 0 || now.Sub(s.namedAt) >= s.cfg.nameCheckEvery
	if err := s.lock.check(byName); err != nil {
		return err
	}
	if !byName {
		return nil
	}
	named, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("audit log was removed (check %s): %w", s.cfg.Dir, err)
	}
	if st.Nlink == 0 || !os.SameFile(s.fi, named) {
		return fmt.Errorf("audit log %s was replaced by another file; restart to continue in it", s.path)
	}
	s.namedAt = now
	return nil
}

// rotate renames audit.log to its rotated name and opens a fresh audit.log.
func (s *FileSink) rotate() error {
	if s.cfg.Fsync != FsyncNever {
		if err := s.f.Sync(); err != nil {
			s.broken = fmt.Errorf("fsync %s before rotation: %w", s.path, err)
			return s.broken
		}
		s.dirty = false
	}
	t := time.Now().UTC()
	if !t.After(s.lastRotated) {
		t = s.lastRotated.Add(time.Nanosecond) // names must sort in rotation order
	}
	rotated := filepath.Join(s.cfg.Dir, rotatedName(t))
	if err := os.Rename(s.path, rotated); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	s.lastRotated = t
	s.f.Close()
	s.f, s.size = nil, 0
	if err := s.open(); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	if s.cfg.Fsync != FsyncNever {
		if err := syncDir(s.cfg.Dir); err != nil {
			return fmt.Errorf("rotate audit log: %w", err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	return nil
}

// syncLoop is batch mode's timer: it syncs unsynced writes every FsyncInterval.
func (s *FileSink) syncLoop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.FsyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			if s.dirty && s.f != nil && s.broken == nil {
				if err := s.f.Sync(); err != nil {
					s.broken = fmt.Errorf("fsync %s: %w", s.path, err)
				}
				s.dirty = false
			}
			s.mu.Unlock()
		}
	}
}

// Close syncs (in every mode) and closes audit.log. It is idempotent.
func (s *FileSink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var err error
	if s.f != nil {
		if serr := s.f.Sync(); serr != nil {
			err = fmt.Errorf("fsync %s: %w", s.path, serr)
		}
		if cerr := s.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", s.path, cerr)
		}
		s.f = nil
	}
	s.closeReserve()
	s.lock.release()
	s.mu.Unlock()
	if s.stop != nil {
		close(s.stop)
		<-s.done
	}
	return err
}

// lastLineHash returns the stored hash of the file's last line, "" for an empty file.
func lastLineHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read last audit event: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("read last audit event: %w", err)
	}
	size := fi.Size()
	if size == 0 {
		return "", nil
	}
	// Read backwards in growing chunks until the chunk holds the newline before the last line.
	for chunk := int64(64 << 10); ; chunk *= 4 {
		off := max(size-chunk, 0)
		buf := make([]byte, size-off)
		if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read last audit event from %s: %w", path, err)
		}
		if buf[len(buf)-1] != '\n' {
			return "", fmt.Errorf("%s ends with an incomplete line (cut off during a write?): "+
				"run 'sandgate audit verify', then move the file aside or remove the partial line", path)
		}
		body := buf[:len(buf)-1]
		i := bytes.LastIndexByte(body, '\n')
		if i < 0 && off > 0 && chunk < maxLineSize*4 {
			continue
		}
		h, err := storedHash(body[i+1:])
		if err != nil {
			return "", fmt.Errorf("read last audit event from %s: %w", path, err)
		}
		return h, nil
	}
}

// CountLines counts the lines of the log from its start, for a writer with checkpoints. It reads
// the files newest first until it finds a checkpoint, which holds the count up to it, so after
// the first checkpoint a restart reads about one file; before that it reads the whole log once.
func (s *FileSink) CountLines() (uint64, error) {
	files, err := logFiles(s.cfg.Dir)
	if err != nil {
		return 0, err
	}
	var after uint64 // lines in the files newer than the one being read
	for i := len(files) - 1; i >= 0; i-- {
		var (
			n, sinceCheckpoint uint64
			base               uint64
			found              bool
		)
		err := scanLines(files[i], func(_ int, line []byte, lineErr error) error {
			n++
			sinceCheckpoint++
			if lineErr == nil && lineKind(line) == KindCheckpoint {
				rec, err := parseRecord(line, KindCheckpoint)
				if err != nil {
					return fmt.Errorf("read checkpoint in %s: %w", files[i], err)
				}
				base, sinceCheckpoint, found = rec.Checkpoint.Count+1, 0, true
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("count audit log lines: %w", err)
		}
		if found {
			return base + sinceCheckpoint + after, nil
		}
		after += n
	}
	return after, nil
}
