package policy

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// rotatedSuffix names a rotated file: File.<UTC time>, fixed width so names sort by age.
const rotatedSuffix = "20060102T150405.000000000Z"

// rotatingFile is the decision log's file: JSON lines, buffered, rotated by size. It is used by
// one goroutine.
type rotatingFile struct {
	path     string
	maxSize  int64
	maxFiles int
	f        *os.File
	w        *bufio.Writer
	size     int64
}

func openRotatingFile(path string, maxSize int64, maxFiles int) (*rotatingFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("decision log: %w", err)
	}
	r := &rotatingFile{path: path, maxSize: maxSize, maxFiles: maxFiles}
	return r, r.open()
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("decision log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("decision log: %w", err)
	}
	r.f, r.size = f, st.Size()
	if r.w == nil {
		r.w = bufio.NewWriterSize(f, 64<<10)
	} else {
		r.w.Reset(f)
	}
	return nil
}

// writeLine writes one encoded event, newline included.
func (r *rotatingFile) writeLine(line []byte) error {
	if r.size > 0 && r.size+int64(len(line)) > r.maxSize {
		if err := r.rotate(); err != nil {
			return err
		}
	}
	n, err := r.w.Write(line)
	r.size += int64(n)
	return err
}

func (r *rotatingFile) flush() error { return r.w.Flush() }

func (r *rotatingFile) rotate() error {
	if err := r.w.Flush(); err != nil {
		return err
	}
	if err := r.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(r.path, r.path+"."+time.Now().UTC().Format(rotatedSuffix)); err != nil {
		return fmt.Errorf("rotate decision log: %w", err)
	}
	if err := r.open(); err != nil {
		return err
	}
	rotated, err := DecisionLogFiles(r.path)
	if err != nil {
		return nil // the active file is open; pruning waits for the next rotation
	}
	rotated = rotated[:len(rotated)-1]
	for len(rotated) > r.maxFiles {
		_ = os.Remove(rotated[0])
		rotated = rotated[1:]
	}
	return nil
}

func (r *rotatingFile) close() error {
	err := r.w.Flush()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// DecisionLogFiles lists the files of the decision log whose active file is path, oldest
// first: the rotated ones, then path itself when it exists.
func DecisionLogFiles(path string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("decision log: %w", err)
	}
	base := filepath.Base(path)
	var files []string
	active := false
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == base:
			active = true
		case strings.HasPrefix(name, base+".") && isRotatedSuffix(name[len(base)+1:]):
			files = append(files, filepath.Join(filepath.Dir(path), name))
		}
	}
	slices.Sort(files)
	if active {
		files = append(files, path)
	}
	return files, nil
}

func isRotatedSuffix(s string) bool {
	_, err := time.Parse(rotatedSuffix, s)
	return err == nil
}
