package audit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ActiveFile is the file the FileSink appends to. Rotated files are named
// audit-YYYYMMDDTHHMMSS.NNNNNNNNN.log after the UTC time of their rotation, so their names sort
// oldest first.
const ActiveFile = "audit.log"

const (
	rotatedPrefix = "audit-"
	rotatedSuffix = ".log"
	rotatedLayout = "20060102T150405.000000000"
)

// maxLineSize bounds one line when reading; a longer line counts as malformed.
const maxLineSize = 16 << 20

// rotatedName is the file name for a file rotated at t.
func rotatedName(t time.Time) string {
	return rotatedPrefix + t.UTC().Format(rotatedLayout) + rotatedSuffix
}

// parseRotatedName returns the rotation time in a rotated file's name.
func parseRotatedName(name string) (time.Time, bool) {
	ts, ok := strings.CutPrefix(name, rotatedPrefix)
	if !ok {
		return time.Time{}, false
	}
	ts, ok = strings.CutSuffix(ts, rotatedSuffix)
	if !ok || len(ts) != len(rotatedLayout) {
		return time.Time{}, false
	}
	t, err := time.Parse(rotatedLayout, ts)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// logFiles lists the log in dir in chain order: rotated files oldest first, then audit.log if it
// exists. Other files in dir are ignored.
func logFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list audit log files: %w", err)
	}
	var rotated []string
	active := false
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if e.Name() == ActiveFile {
			active = true
			continue
		}
		if _, ok := parseRotatedName(e.Name()); ok {
			rotated = append(rotated, e.Name())
		}
	}
	slices.Sort(rotated)
	if active {
		rotated = append(rotated, ActiveFile)
	}
	paths := make([]string, len(rotated))
	for i, n := range rotated {
		paths[i] = filepath.Join(dir, n)
	}
	return paths, nil
}

// errIncompleteLine is passed to scanLines' callback for a last line without its newline.
var errIncompleteLine = errors.New("last line has no newline (cut off during a write?)")

// errLineTooLong is passed to scanLines' callback for a line over maxLineSize.
var errLineTooLong = fmt.Errorf("line longer than %d bytes", maxLineSize)

// scanLines calls fn for every line of the file at path, numbered from 1, without its newline.
// lineErr is errIncompleteLine or errLineTooLong for such lines, nil otherwise. The line is only
// valid during the call. An error from fn stops the scan and is returned.
func scanLines(path string, fn func(n int, line []byte, lineErr error) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 256<<10)
	var long []byte
	for n := 1; ; n++ {
		var (
			line    []byte
			tooLong bool
		)
		line, tooLong, long, err = readLine(r, long)
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return fmt.Errorf("read %s line %d: %w", path, n, err)
		}
		if eof && len(line) == 0 && !tooLong {
			return nil
		}
		var lineErr error
		switch {
		case tooLong:
			lineErr = errLineTooLong
		case eof:
			lineErr = errIncompleteLine
		default:
			line = line[:len(line)-1]
		}
		if ferr := fn(n, line, lineErr); ferr != nil {
			return ferr
		}
		if eof {
			return nil
		}
	}
}

// readLine reads up to and including the next newline. A line longer than the reader's buffer is
// assembled in long (returned for reuse); past maxLineSize the rest of it is skipped.
func readLine(r *bufio.Reader, long []byte) (line []byte, tooLong bool, _ []byte, err error) {
	line, err = r.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, false, long, err
	}
	long = append(long[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = r.ReadSlice('\n')
		if len(long) <= maxLineSize {
			long = append(long, line...)
		}
	}
	tooLong = len(long) > maxLineSize
	if tooLong {
		long = long[:0]
	}
	return long, tooLong, long, err
}
