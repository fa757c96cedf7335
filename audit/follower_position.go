package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// This file is a follower's position keeping: which file and byte it is at, how it finds its
// place again after a restart or a rotation, and the cursor file that survives restarts.

// cursorRecord is a cursor file's content: the byte range and hash of the last line sent. Stream
// holds the follower's CursorTag (named for the Redis mirror's stream, the first follower, so that
// its cursor files stay valid).
type cursorRecord struct {
	Stream string `json:"stream"`
	File   string `json:"file"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Hash   string `json:"hash"`
}

// position is where the next line to send starts.
type position struct {
	path   string      // "" until located
	info   os.FileInfo // identifies the file across a rename by rotation
	offset int64
	start  int64  // of the last line sent in path, for the cursor
	hash   string // of the last line sent
	// located is set when the position was just found by its hash: the next line is then taken as
	// it is even if its prev_hash disagrees (a broken chain is Verify's to report, not a reason
	// to search forever).
	located bool
}

// currentIndex finds the file the follower is reading among files, by identity (it may have been
// renamed by rotation), or -1.
func (f *Follower) currentIndex(files []string) int {
	if f.pos.info == nil {
		return -1
	}
	if fi, err := os.Stat(f.pos.path); err == nil && os.SameFile(fi, f.pos.info) {
		for i, p := range files {
			if p == f.pos.path {
				return i
			}
		}
	}
	for i, p := range files {
		if fi, err := os.Stat(p); err == nil && os.SameFile(fi, f.pos.info) {
			return i
		}
	}
	return -1
}

func (f *Follower) openAt(path string, offset int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s: %w", f.cfg.Name, err)
	}
	// The hash of the last line sent stays: the chain check in pump needs it across files.
	f.pos = position{path: path, info: fi, offset: offset, hash: f.pos.hash}
	return nil
}

// locate finds where to continue: after the last line sent, in whichever file holds it now. A
// follower that has sent lines knows that line's hash, which is never older than the cursor file
// (saved from it every cursorSaveEvery); only a follower that has sent nothing yet (a restart)
// reads the cursor: after the line it names, where it was or (after a rotation) in whichever
// file holds it. Else from the start of the oldest file.
//
// The cursor came first until 2026-12-03: a follower that lost sight of its file (a rotation
// between listing and stat) went back to the cursor's older line and sent lines again, which
// the stream mirror's marker does not catch when the repeat ends before the last line sent. A
// likely path to the two copies of four lines TestStreamMirrorCopiesEveryLineOnceInOrder saw
// once under -race on a busy machine.
func (f *Follower) locate(files []string) error {
	if f.pos.hash != "" {
		return f.locateHash(files, f.pos.hash)
	}
	if c, ok := f.loadCursor(); ok {
		p := filepath.Join(f.cfg.Dir, c.File)
		if lineAt(p, c.Start, c.End) == c.Hash {
			if err := f.openAt(p, c.End); err == nil {
				f.pos.start, f.pos.hash, f.pos.located = c.Start, c.Hash, true
				return nil
			}
		}
		if c.Hash != "" {
			return f.locateHash(files, c.Hash)
		}
	}
	f.pos = position{}
	return f.openOldest(files)
}

// openOldest starts at the beginning of the oldest file. files was listed before: a rotation
// since then renamed the file files[0] names (when it was the active audit.log) and opening that
// name would start on the new, empty log, skipping every line of the rotated one (seen as a
// follower that never sent the first file's events). So the opened file must still be the oldest
// in a new listing; otherwise look again.
func (f *Follower) openOldest(files []string) error {
	for attempt := 0; ; attempt++ {
		if err := f.openAt(files[0], 0); err != nil {
			return err
		}
		again, err := logFiles(f.cfg.Dir)
		if err != nil {
			return err
		}
		if len(again) == 0 || attempt == locateAttempts-1 {
			return nil
		}
		if fi, err := os.Stat(again[0]); err == nil && os.SameFile(fi, f.pos.info) {
			return nil
		}
		files = again
	}
}

// locateHash continues after the line whose hash is hash, or from the start of the oldest file
// when no file holds it any more. A rotation between listing the files and scanning them renames
// the active file under the scan (the name then holds the new, empty log), so a miss lists the
// files again before giving up: restarting from the oldest file would send everything twice.
func (f *Follower) locateHash(files []string, hash string) error {
	for attempt := 0; ; attempt++ {
		found, err := f.seekHash(files, hash)
		if found || err != nil {
			return err
		}
		if attempt == locateAttempts-1 {
			break
		}
		if files, err = logFiles(f.cfg.Dir); err != nil {
			return err
		}
	}
	f.restarts.Add(1)
	f.pos = position{}
	if len(files) == 0 {
		return nil
	}
	return f.openOldest(files)
}

// locateAttempts bounds how often locateHash lists the files again after a miss.
const locateAttempts = 3

// seekHash positions the follower after the line whose hash is hash, if one of files holds it.
func (f *Follower) seekHash(files []string, hash string) (bool, error) {
	for _, p := range files {
		var start, end int64
		found := false
		_ = scanLines(p, func(_ int, line []byte, lineErr error) error {
			start, end = end, end+int64(len(line))+1
			if lineErr == nil {
				if h, err := storedHash(line); err == nil && h == hash {
					found = true
					return errFound
				}
			}
			return nil
		})
		if found {
			if err := f.openAt(p, end); err != nil {
				return false, err
			}
			f.pos.start, f.pos.hash, f.pos.located = start, hash, true
			return true, nil
		}
	}
	return false, nil
}

var (
	errFound = errors.New("found")
	errMoved = errors.New("file was moved")
)

// linePrevHash returns the prev_hash of a log line ("" when it cannot be parsed).
func linePrevHash(line []byte) string {
	ev, err := ParseLine(line)
	if err != nil {
		return ""
	}
	return ev.PrevHash
}

func (f *Follower) loadCursor() (cursorRecord, bool) {
	var c cursorRecord
	b, err := os.ReadFile(filepath.Join(f.cfg.Dir, f.cfg.CursorFile))
	if err != nil || json.Unmarshal(b, &c) != nil || c.Stream != f.cfg.CursorTag || c.Hash == "" {
		return cursorRecord{}, false
	}
	return c, true
}

// cursorSaveEvery bounds how long a catch-up goes without writing its cursor. A cursor write per
// batch (a file written and renamed) was a quarter of the OTLP exporter's CPU under the bench's
// route load, 20 batches a second; the follower now writes it once it has caught up, about once
// a linger. Filebeat's registry flush is 1s too.
const cursorSaveEvery = time.Second

// saveUnsaved writes the cursor if the position moved since it was last written.
func (f *Follower) saveUnsaved() {
	if f.unsaved {
		f.saveCursor()
	}
}

// saveCursor writes the cursor by rename, so a crash leaves the old or the new one. Losing it only
// means lines are sent again.
func (f *Follower) saveCursor() {
	f.unsaved, f.savedAt = false, f.now()
	b, _ := json.Marshal(cursorRecord{
		Stream: f.cfg.CursorTag, File: filepath.Base(f.pos.path), Start: f.pos.start, End: f.pos.offset, Hash: f.pos.hash,
	})
	path := filepath.Join(f.cfg.Dir, f.cfg.CursorFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return
	}
	_ = os.Rename(tmp, path)
}

// batchReader reads a follower's batches. What one batch needs is kept for the next: the
// bufio.Reader and the bytes the lines are cut from (BenchmarkExport: reading each line into a
// slice of its own, with a new 64 KiB reader per batch, was a third of the exporter's
// allocations). The lines a read returns are valid until the next read.
type batchReader struct {
	br    *bufio.Reader
	arena []byte  // the batch's lines, newlines included
	cuts  []int   // where each line's newline is in arena
	ends  []int64 // the file offset just past each line
	lines [][]byte
}

// maxKeptArena is the most a batchReader keeps between batches: a batch of unusually long
// lines is read, then its bytes are let go.
const maxKeptArena = 4 << 20

// read reads up to max newline-terminated lines from offset, returning them without newlines
// with the offset just past each. partial reports bytes after the last complete line. It
// returns errMoved when path is no longer the file want.
func (b *batchReader) read(path string, want os.FileInfo, offset int64, max int) (lines [][]byte, ends []int64, partial bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, false, errMoved
	}
	if err != nil {
		return nil, nil, false, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !os.SameFile(fi, want) {
		return nil, nil, false, errMoved
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, nil, false, fmt.Errorf("seek %s: %w", path, err)
	}
	if b.br == nil {
		b.br = bufio.NewReaderSize(f, 64<<10)
	} else {
		b.br.Reset(f)
	}
	defer b.br.Reset(nil) // the file is closed; keep only the buffer
	if cap(b.arena) > maxKeptArena {
		b.arena = nil
	}
	b.arena, b.cuts, b.ends = b.arena[:0], b.cuts[:0], b.ends[:0]
	pos := offset
	for len(b.cuts) < max {
		start := len(b.arena)
		complete, err := b.readLine()
		if err != nil {
			return nil, nil, false, fmt.Errorf("read %s: %w", path, err)
		}
		if !complete {
			partial = len(b.arena) > start
			b.arena = b.arena[:start]
			break
		}
		pos += int64(len(b.arena) - start)
		b.cuts = append(b.cuts, len(b.arena)-1)
		b.ends = append(b.ends, pos)
	}
	b.lines = b.lines[:0]
	from := 0
	for _, c := range b.cuts {
		b.lines = append(b.lines, b.arena[from:c:c])
		from = c + 1
	}
	return b.lines, b.ends, partial, nil
}

// readLine appends the next line to arena; complete is false at the end of the file.
func (b *batchReader) readLine() (complete bool, err error) {
	for {
		chunk, err := b.br.ReadSlice('\n')
		b.arena = append(b.arena, chunk...)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return false, nil
		default:
			return false, err
		}
	}
}

// lineAt returns the stored hash of the line at [start, end) of path ("" when it is not one).
func lineAt(path string, start, end int64) string {
	if start < 0 || end <= start || end-start > maxLineSize {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, end-start)
	if _, err := f.ReadAt(b, start); err != nil || b[len(b)-1] != '\n' {
		return ""
	}
	h, _ := storedHash(b[:len(b)-1])
	return h
}

// lineID returns the event ID of a log line: "id" is the first member of every line.
func lineID(line []byte) string {
	const prefix = `{"id":"`
	if len(line) > len(prefix)+36 && string(line[:len(prefix)]) == prefix && line[len(prefix)+36] == '"' {
		return string(line[len(prefix) : len(prefix)+36])
	}
	if ev, err := ParseLine(line); err == nil {
		return ev.ID
	}
	return ""
}

// lineTime returns the time of a log line: "time" is the second member of every line, after the
// 36-character ID, so the common case needs no JSON decoding.
func lineTime(line []byte) (time.Time, bool) {
	const prefix = `{"id":"`
	const timeKey = `","time":"`
	if n := len(prefix) + 36; len(line) > n+len(timeKey) && string(line[n:n+len(timeKey)]) == timeKey {
		rest := line[n+len(timeKey):]
		if end := bytes.IndexByte(rest, '"'); end > 0 {
			if t, err := time.Parse(time.RFC3339Nano, string(rest[:end])); err == nil {
				return t, true
			}
		}
	}
	var v struct {
		Time time.Time `json:"time"`
	}
	if json.Unmarshal(line, &v) != nil || v.Time.IsZero() {
		return time.Time{}, false
	}
	return v.Time, true
}
