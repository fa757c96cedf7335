package audit

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// VerifyOptions says what Verify can check beyond the plain chain.
type VerifyOptions struct {
	// ChainKey is the chain key. Without it a keyed log cannot be verified (ErrChainKeyNeeded).
	// With it, a log that is not keyed, or whose newest lines are not, is reported in Unkeyed.
	ChainKey []byte
	// PublicKey checks the signature of every checkpoint. Without it checkpoints are checked for
	// consistency with the chain only, which a rewriter can keep.
	PublicKey ed25519.PublicKey
	// External are checkpoints kept outside the log (the process log, another system): the log
	// must reach each one's Count and hash to its LastHash there, which reveals a truncated or
	// replaced log. Their signatures are checked when PublicKey is set.
	External []Checkpoint
}

// ErrChainKeyNeeded is returned by Verify for a keyed log when no chain key was given.
var ErrChainKeyNeeded = errors.New("the audit log is keyed: verify it with the chain key")

// VerifyReport is the result of Verify.
type VerifyReport struct {
	// Files is the number of log files found; Events the number of call events, Checkpoints the
	// number of checkpoints and Lines the number of lines checked and found intact (up to the
	// break, if there is one).
	Files       int
	Events      int
	Checkpoints int
	Lines       int
	// Chain is the algorithm of the newest line: ChainSHA256 or ChainHMACSHA256.
	Chain string
	// Break is the first place the chain does not hold; nil when the log is intact.
	Break *Break
	// TwoWriters is where a second chain begins, interleaved with the first: two processes
	// appended to the log at once (forks.go). Each chain is verified on its own, and Break is
	// the first place one of them does not hold; the log fails verification either way.
	TwoWriters *Break
	// Unkeyed is set when a chain key was given but the log is not keyed, or its newest lines are
	// not (a writer without the key, or a rewrite by someone without it): the place where the
	// unkeyed lines start and why it matters.
	Unkeyed *Break
	// Warnings are weaker findings: no checkpoint in a log verified with a public key.
	Warnings []string
	// Recoveries are the torn tails cut from the log at start (KindRecovered records, chained
	// like every line): where each record is and what it says was cut.
	Recoveries []RecoveryAt
}

// RecoveryAt is a KindRecovered record of the log and its place.
type RecoveryAt struct {
	// Log and Line locate the record.
	Log  string
	Line int
	Recovery
}

func (r RecoveryAt) String() string {
	return fmt.Sprintf("%s:%d: torn tail cut at start after a crash: %s", r.Log, r.Line, &r.Recovery)
}

// Break locates where the chain fails and says why.
type Break struct {
	File   string // path of the file
	Line   int    // 1-based line number in File
	Reason string
}

func (b *Break) String() string {
	if b.File == "" {
		return b.Reason
	}
	return fmt.Sprintf("%s:%d: %s", b.File, b.Line, b.Reason)
}

// OK reports whether no break was found, and the log has one writer.
func (r *VerifyReport) OK() bool { return r.Break == nil && r.TwoWriters == nil }

// Complete reports whether the log verified with every protection the given keys call for: no
// break, not unkeyed where a key was given, and no warning.
func (r *VerifyReport) Complete() bool { return r.OK() && r.Unkeyed == nil && len(r.Warnings) == 0 }

// plural writes n and the noun, with an s unless n is 1: "1 event", "2 events".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func (r *VerifyReport) String() string {
	if r.Break != nil || r.TwoWriters != nil {
		var s string
		if r.TwoWriters != nil {
			s = r.TwoWriters.String()
			if r.Break == nil {
				s += fmt.Sprintf(" (each chain verified: %s)", plural(r.Events, "event"))
			} else {
				s += "\n"
			}
		}
		if r.Break != nil {
			s += fmt.Sprintf("chain broken at %s (%s before it verified)", r.Break, plural(r.Events, "event"))
		}
		for _, rc := range r.Recoveries {
			s += "\nrecovered: " + rc.String()
		}
		return s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ok: %s in %s", plural(r.Events, "event"), plural(r.Files, "file"))
	if r.Checkpoints > 0 {
		fmt.Fprintf(&b, ", %s", plural(r.Checkpoints, "checkpoint"))
	}
	if r.Chain == ChainHMACSHA256 {
		b.WriteString(" (keyed chain)")
	} else if r.Lines > 0 {
		b.WriteString(" (unkeyed chain: anyone who can write the files can recompute it)")
	}
	if r.Unkeyed != nil {
		fmt.Fprintf(&b, "\nunkeyed: %s", r.Unkeyed)
	}
	for _, rc := range r.Recoveries {
		fmt.Fprintf(&b, "\nrecovered: %s", rc)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "\nwarning: %s", w)
	}
	return b.String()
}

// Verify checks the plain hash chain of the log in dir; see VerifyWith.
func Verify(dir string) (*VerifyReport, error) { return VerifyWith(dir, VerifyOptions{}) }

// VerifyWith checks the hash chain of the log in dir: rotated files oldest first, then audit.log.
// For every line it recomputes the hash from the canonical form (SHA-256 until a KindChain record
// switches to HMAC-SHA-256 under the chain key) and checks that prev_hash equals the hash of the
// line before (across file boundaries); the first line of the log must have an empty prev_hash.
// Every checkpoint must count the lines before it and name the hash of the last of them, and, with
// o.PublicKey, carry a valid signature. It stops at the first break.
//
// This finds an edited, malformed, removed or reordered line, including the first or last line of
// a rotated file and a whole missing rotated file (the break shows on the line after the gap). A
// rewriter can recompute a plain chain, not a keyed one nor a signature; lines cut off the end
// are found only against a checkpoint kept elsewhere (o.External). docs/audit.md has the table.
// It reports a break when the oldest files were removed on purpose, since the log then no longer
// starts at its first line.
//
// The returned error is for a log that cannot be read, or is keyed while o.ChainKey is nil
// (ErrChainKeyNeeded); a broken chain is reported in the report.
func VerifyWith(dir string, o VerifyOptions) (*VerifyReport, error) {
	files, err := logFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("verify audit log: %w", err)
	}
	for i := range o.External {
		if o.PublicKey == nil {
			break
		}
		if err := o.External[i].CheckSignature(o.PublicKey); err != nil {
			r := &VerifyReport{Files: len(files)}
			r.Break = &Break{Reason: fmt.Sprintf("external checkpoint %d (count %d): %v", i+1, o.External[i].Count, err)}
			return r, nil
		}
	}
	v := &verifier{o: o, r: &VerifyReport{Files: len(files), Chain: ChainSHA256}, hashAt: map[uint64]string{}}
	v.chain = plainChain
	v.recent.states = true // a second chain is verified from where it forked
	if o.ChainKey != nil {
		v.keyed = newKeyedChain(o.ChainKey)
	}
	for _, c := range o.External {
		v.hashAt[c.Count] = ""
	}
	for _, path := range files {
		err := scanLines(path, func(n int, line []byte, lineErr error) error {
			v.file, v.n = path, n
			reason, err := v.line(line, lineErr)
			if err != nil {
				return fmt.Errorf("%s:%d: %w", path, n, err)
			}
			if reason != "" {
				v.r.Break = &Break{File: path, Line: n, Reason: reason}
				return errStop
			}
			return nil
		})
		v.r.TwoWriters = v.forked
		if errors.Is(err, errStop) {
			return v.r, nil
		}
		if err != nil {
			return nil, fmt.Errorf("verify audit log: %w", err)
		}
	}
	v.finish()
	return v.r, nil
}

// verifier walks the lines of one log.
type verifier struct {
	o VerifyOptions
	r *VerifyReport
	// writers holds the chain the current line continues (its hash, last line, count) and, in a
	// log two processes wrote at once, the other one (forks.go).
	writers
	keyed *chainHash // under o.ChainKey, nil without it
	// hashAt holds, for each external checkpoint's Count, the hash of the line at that position.
	hashAt map[uint64]string
	// file and n are where the line being checked is.
	file string
	n    int
}

// line checks one line and moves on; it returns why the chain breaks there, or "".
func (v *verifier) line(line []byte, lineErr error) (string, error) {
	if lineErr != nil {
		return "malformed line: " + lineErr.Error(), nil
	}
	linePrev, stored, err := linkedHashes(line)
	if err != nil {
		return "malformed line: " + err.Error(), nil
	}
	if !json.Valid(line) {
		return "malformed line: not valid JSON", nil
	}
	if v.r.Lines == 0 && linePrev == "" {
		v.starts(v.file, v.n)
	}
	linked := v.r.Lines > 0 && v.follow(linePrev, stored, v.file, v.n)
	kind := lineKind(line)
	var rec record
	if isRecordKind(Kind(kind)) {
		if rec, err = parseRecord(line, kind); err != nil {
			return "malformed " + kind + " record: " + err.Error(), nil
		}
	}

	chain := v.chain
	if kind == KindChain {
		switch rec.Chain.Alg {
		case ChainHMACSHA256:
			if v.keyed == nil {
				return "", fmt.Errorf("%w (key id %s) from here on: give --key-file or a --config "+
					"with audit.chain_key_credential", ErrChainKeyNeeded, rec.Chain.KeyID)
			}
			if rec.Chain.KeyID != v.keyed.keyID {
				return fmt.Sprintf("wrong chain key: the log is keyed with key id %s, the given key has id %s",
					rec.Chain.KeyID, v.keyed.keyID), nil
			}
			chain = v.keyed
		case ChainSHA256:
			chain = plainChain
		default:
			return fmt.Sprintf("unknown chain algorithm %q", rec.Chain.Alg), nil
		}
	}
	if !chain.matches(line, stored) {
		if chain.mac == nil || kind == KindChain || !plainChain.matches(line, stored) {
			if chain.mac != nil {
				return "hash does not match the line's content under the chain key: the line was edited", nil
			}
			return "hash does not match the line's content: the line was edited", nil
		}
		// A plain line where the log is keyed: written without the key. Verified as plain from
		// here on; the report says so unless a keyed part follows and covers it.
		chain = plainChain
	}
	switch {
	case linked, v.r.Lines == 0 && linePrev == "":
	case v.r.Lines == 0:
		return "prev_hash is set but no line comes before it: the start of the log " +
			"(a line or an older rotated file) is missing", nil
	default:
		return "prev_hash does not match the previous line's hash: a line before this " +
			"one is missing (a line or a whole file), or lines were reordered", nil
	}
	if reason := v.count(kind, rec, chain); reason != "" {
		return reason, nil
	}
	v.chain = chain
	v.r.Chain = chain.alg
	if chain.mac != nil {
		v.keyedSeen, v.unkeyedFrom = true, nil
	} else if v.unkeyedFrom == nil {
		v.unkeyedFrom = &Break{File: v.file, Line: v.n}
	}
	v.r.Lines++
	v.lines++
	if _, ok := v.hashAt[uint64(v.lines)]; ok {
		v.hashAt[uint64(v.lines)] = stored
	}
	v.linked(stored, v.file, v.n)
	return "", nil
}

// count counts a line that chains by its kind: a call event, a checkpoint (checked first), a
// recovery; it returns why a checkpoint does not hold, or "".
func (v *verifier) count(kind string, rec record, chain *chainHash) string {
	switch kind {
	case KindCheckpoint:
		if reason := v.checkpoint(rec.Checkpoint, chain); reason != "" {
			return reason
		}
		v.r.Checkpoints++
	case KindRecovered:
		v.r.Recoveries = append(v.r.Recoveries, RecoveryAt{Log: v.file, Line: v.n, Recovery: *rec.Recovered})
	case KindChain:
	default:
		v.r.Events++
	}
	return ""
}

// checkpoint checks an in-log checkpoint against the chain before it.
func (v *verifier) checkpoint(c *Checkpoint, chain *chainHash) string {
	switch {
	case c.Count != uint64(v.lines):
		return fmt.Sprintf("checkpoint counts %d lines before it, the log has %d: lines were removed "+
			"or added before it", c.Count, v.lines)
	case c.LastHash != v.prev:
		return "checkpoint's last_hash is not the hash of the line before it: the log before it was rewritten"
	case c.Chain != chain.alg:
		return fmt.Sprintf("checkpoint says the chain is %s here, but it is %s: the log was rewritten", c.Chain, chain.alg)
	}
	if v.o.PublicKey != nil {
		if err := c.CheckSignature(v.o.PublicKey); err != nil {
			return err.Error()
		}
	}
	return ""
}

// finish checks the external checkpoints and what the given keys promise.
func (v *verifier) finish() {
	for i, c := range v.o.External {
		switch got := v.hashAt[c.Count]; {
		case uint64(v.lines) < c.Count:
			v.r.Break = &Break{Reason: fmt.Sprintf("the log ends after %d lines, but external checkpoint %d "+
				"(%s) counts %d: the end of the log was cut off, or the log was replaced%s",
				v.lines, i+1, c.Time.UTC().Format("2006-01-02T15:04:05Z"), c.Count, v.recoveryHint())}
			return
		case got != c.LastHash:
			v.r.Break = &Break{Reason: fmt.Sprintf("line %d of the log hashes to %s, but external checkpoint %d "+
				"(%s) says %s: the log was rewritten or replaced%s", c.Count, short(got), i+1,
				c.Time.UTC().Format("2006-01-02T15:04:05Z"), short(c.LastHash), v.recoveryHint())}
			return
		}
	}
	if v.keyed != nil && v.r.Lines > 0 {
		switch {
		case !v.keyedSeen:
			v.r.Unkeyed = &Break{Reason: "no line is keyed: the log was written without the chain key, " +
				"or rewritten by someone without it"}
		case v.unkeyedFrom != nil:
			u := *v.unkeyedFrom
			u.Reason = "the newest lines, from here on, are not keyed: written without the chain key, " +
				"or rewritten by someone without it"
			v.r.Unkeyed = &u
		}
	}
	if v.o.PublicKey != nil && v.r.Checkpoints == 0 && v.r.Lines > 0 {
		v.r.Warnings = append(v.r.Warnings, "no checkpoint in the log: written without checkpoints, "+
			"or they were removed with the lines after them")
	}
}

// recoveryHint explains a checkpoint the log no longer reaches when a torn tail was cut: lines
// written but not yet on disk when the host crashed are lost with fsync batch or never.
func (v *verifier) recoveryHint() string {
	if len(v.r.Recoveries) == 0 {
		return ""
	}
	return fmt.Sprintf(" (or lost in a host crash: a torn tail was cut at %s:%d; lines not yet synced to disk "+
		"are lost unless audit.file.fsync is always)", v.r.Recoveries[0].Log, v.r.Recoveries[0].Line)
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	if h == "" {
		return "(nothing)"
	}
	return h
}

// errStop ends a scan early.
var errStop = errors.New("stop")
