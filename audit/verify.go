package audit

import (
	"encoding/json"
	"errors"
	"fmt"
)

// VerifyReport is the result of Verify.
type VerifyReport struct {
	// Files is the number of log files found, Events the number of events checked and found
	// intact (up to the break, if there is one).
	Files  int
	Events int
	// Break is the first place the chain does not hold; nil when the log is intact.
	Break *Break
}

// Break locates where the chain fails and says why.
type Break struct {
	File   string // path of the file
	Line   int    // 1-based line number in File
	Reason string
}

func (b *Break) String() string {
	return fmt.Sprintf("%s:%d: %s", b.File, b.Line, b.Reason)
}

// OK reports whether no break was found.
func (r *VerifyReport) OK() bool { return r.Break == nil }

func (r *VerifyReport) String() string {
	if r.Break == nil {
		return fmt.Sprintf("ok: %d events in %d files", r.Events, r.Files)
	}
	return fmt.Sprintf("chain broken at %s (%d events before it verified)", r.Break, r.Events)
}

// Verify checks the hash chain of the log in dir: rotated files oldest first, then audit.log.
// For every line it recomputes the hash from the canonical form and checks that prev_hash equals
// the hash of the line before (across file boundaries); the first event of the log must have an
// empty prev_hash. It stops at the first break.
//
// This finds an edited, malformed, removed or reordered line, including the first or last line of
// a rotated file and a whole missing rotated file (the break shows on the line after the gap). It
// cannot find lines cut off the end of audit.log at a line boundary, and it reports a break when
// the oldest files were removed on purpose, since the log then no longer starts at its first event.
//
// The returned error is for a log that cannot be read; a broken chain is reported in the report.
func Verify(dir string) (*VerifyReport, error) {
	files, err := logFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("verify audit log: %w", err)
	}
	r := &VerifyReport{Files: len(files)}
	prev := ""
	for _, path := range files {
		err := scanLines(path, func(n int, line []byte, lineErr error) error {
			reason := checkLine(line, lineErr, prev, r.Events == 0)
			if reason != "" {
				r.Break = &Break{File: path, Line: n, Reason: reason}
				return errStop
			}
			prev, _ = storedHash(line)
			r.Events++
			return nil
		})
		if errors.Is(err, errStop) {
			return r, nil
		}
		if err != nil {
			return nil, fmt.Errorf("verify audit log: %w", err)
		}
	}
	return r, nil
}

// errStop ends a scan early.
var errStop = errors.New("stop")

// checkLine returns why line does not continue the chain after prev, or "".
func checkLine(line []byte, lineErr error, prev string, first bool) string {
	if lineErr != nil {
		return "malformed line: " + lineErr.Error()
	}
	linePrev, stored, computed, err := linkedHashes(line)
	if err != nil {
		return "malformed line: " + err.Error()
	}
	if !json.Valid(line) {
		return "malformed line: not valid JSON"
	}
	switch {
	case computed != stored:
		return "hash does not match the line's content: the line was edited"
	case linePrev == prev:
		return ""
	case first:
		return "prev_hash is set but no event comes before it: the start of the log " +
			"(a line or an older rotated file) is missing"
	default:
		return "prev_hash does not match the previous event's hash: an event before this " +
			"line is missing (a line or a whole file), or lines were reordered"
	}
}
