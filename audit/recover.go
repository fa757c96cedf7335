package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/jsonenc"
)

// A process killed while it appends to audit.log, or a host that crashes before the file's data
// reached the disk, can leave a torn tail: a last line cut short, zero bytes where the data was
// to be, or other garbage. The FileSink heals it when it opens (healTail): everything after the
// last whole line is moved into a file beside the log, kept for forensics
// (audit.log.torn-<time>), audit.log is cut back to that line, and the writer starts its part of
// the log with a KindRecovered record that says what was cut. The chain then continues from the
// last whole line, so Verify passes and reports the recovery (VerifyReport.Recoveries) rather
// than a break; with a keyed chain and signed checkpoints the record itself is keyed and covered
// by a checkpoint written right after it.

// KindRecovered is the writer's record of a torn tail cut from the log at start.
const KindRecovered = "audit.recovered"

// tornPrefix starts the name of a file holding a cut tail: audit.log.torn-<UTC time>.
const tornPrefix = ActiveFile + ".torn-"

// maxTornTail bounds what healTail cuts: a torn write is one batch at most, plus whatever a
// crashed host filled with zeros. A longer run without a whole line is not a torn tail; the
// sink refuses to open then, as it did for every torn tail before.
const maxTornTail = 16 << 20

// Recovery is what the FileSink cut from the end of audit.log when it opened.
type Recovery struct {
	// File is the name (in the audit dir) of the file that holds the cut bytes.
	File string `json:"file"`
	// Offset is where audit.log was cut: the byte after the newline of its last whole line.
	Offset int64 `json:"offset"`
	// Bytes is how many bytes were cut, and SHA256 their hash (lowercase hex), which the kept
	// file must match.
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Reason says what the tail looked like: "partial line", "zero bytes" or "garbage".
	Reason string `json:"reason"`
}

func (r *Recovery) String() string {
	return fmt.Sprintf("%d bytes (%s, sha256 %s) cut at offset %d, kept in %s", r.Bytes, r.Reason, short(r.SHA256), r.Offset, r.File)
}

// Recoverer is implemented by a sink that healed a torn tail when it opened; the writer records
// the Recovery before anything else.
type Recoverer interface {
	Recovered() *Recovery
}

// Recovered is the torn tail the sink cut when it opened, or nil.
func (s *FileSink) Recovered() *Recovery { return s.recovered }

// Recovered passes the file sink's recovery through.
func (s *notifyingSink) Recovered() *Recovery {
	if r, ok := s.Sink.(Recoverer); ok {
		return r.Recovered()
	}
	return nil
}

// healTail cuts a torn tail from the file at path, keeping it in a file beside it, and returns
// what it cut (nil when the file ends with a whole line).
func healTail(path string) (*Recovery, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("check the end of the audit log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("check the end of the audit log: %w", err)
	}
	size := fi.Size()
	if size == 0 {
		return nil, nil
	}
	off := max(size-maxTornTail-maxLineSize, 0)
	buf := make([]byte, size-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("check the end of %s: %w", path, err)
	}
	keep, ok := wholeEnd(buf, off == 0)
	if keep == len(buf) {
		return nil, nil
	}
	if !ok || len(buf)-keep > maxTornTail {
		return nil, fmt.Errorf("%s ends with %d bytes that are no whole audit line (more than a torn write): "+
			"run 'sandgate audit verify', then move the file aside", path, len(buf)-keep)
	}
	tail := buf[keep:]
	sum := sha256.Sum256(tail)
	r := &Recovery{Offset: off + int64(keep), Bytes: int64(len(tail)), SHA256: hex.EncodeToString(sum[:]), Reason: tornReason(tail),
		File: tornPrefix + time.Now().UTC().Format(rotatedLayout)}
	dir := filepath.Dir(path)
	if err := writeSynced(filepath.Join(dir, r.File), tail); err != nil {
		return nil, fmt.Errorf("keep the torn tail of %s: %w", path, err)
	}
	if err := f.Truncate(r.Offset); err != nil {
		return nil, fmt.Errorf("cut the torn tail of %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("cut the torn tail of %s: fsync: %w", path, err)
	}
	return r, syncDir(dir)
}

// wholeEnd returns the length of buf up to the end of its last whole line (its newline
// included): a line in the writer's form, valid JSON, with a hash. start says buf begins at the
// start of the file; otherwise its first line may be cut and is never taken as whole. ok is false
// when no whole line ends in buf and buf does not start the file.
func wholeEnd(buf []byte, start bool) (end int, ok bool) {
	end = len(buf)
	for end > 0 {
		nl := bytes.LastIndexByte(buf[:end], '\n')
		if nl < 0 {
			break
		}
		lineStart := bytes.LastIndexByte(buf[:nl], '\n') + 1
		if lineStart == 0 && !start {
			return 0, false
		}
		if whole(buf[lineStart:nl]) {
			return nl + 1, true
		}
		end = lineStart
	}
	return 0, start
}

// whole reports a line in the writer's form: a JSON object ending with the chain members.
func whole(line []byte) bool {
	_, _, err := linkedHashes(line)
	return err == nil && json.Valid(line)
}

// tornReason says what a tail looks like.
func tornReason(tail []byte) string {
	switch {
	case len(bytes.Trim(tail, "\x00")) == 0:
		return "zero bytes"
	case bytes.IndexByte(tail, '\n') < 0 && bytes.IndexByte(tail, 0) < 0 && tail[0] == '{':
		return "partial line"
	}
	return "garbage"
}

// writeSynced creates path with b (mode 0600) and forces it to disk.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// appendRecoveredLine appends the canonical form of a KindRecovered record (hash empty).
func appendRecoveredLine(b []byte, id string, t time.Time, r *Recovery, prev string) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, id)
	b = append(b, `,"time":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":"`+KindRecovered+`","recovered":{"file":`...)
	b = jsonenc.AppendString(b, r.File)
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, r.Offset, 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, r.Bytes, 10)
	b = append(b, `,"sha256":`...)
	b = jsonenc.AppendString(b, r.SHA256)
	b = append(b, `,"reason":`...)
	b = jsonenc.AppendString(b, r.Reason)
	b = append(b, `},"prev_hash":`...)
	b = jsonenc.AppendString(b, prev)
	return append(b, emptyHashSuffix...)
}
