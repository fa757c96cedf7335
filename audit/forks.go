package audit

import (
	"errors"
	"fmt"
)

// Two processes that append to one audit.log (two replicas, or two `make run`, on one folder,
// before the folder was locked: lock.go) each continue the chain from the line they saw last,
// so the file holds two chains, interleaved: a line of the second writer links to a line some
// way back, whose successor the first writer wrote. Verify tells that apart from an edit, a
// removal or a reordering: the line links to a recent line that already has a successor (and is
// not itself a repeat of one), so it starts a second chain, which is then verified on its own
// beside the first (each writer's hashes, keys and checkpoints hold on their own chain). The
// report says "two writers", and the log still fails verification (exit 3): which lines of
// which writer answered which calls is lost to the interleaving. The FileSink refuses to continue
// a log whose active file holds such a fork (forkIn), so a restart never carries one on silently.

// chainState is where one writer's chain stands after a line.
type chainState struct {
	chain *chainHash // its hash: plain, or keyed since its KindChain record
	prev  string     // the hash of its last line
	// lines counts the lines of the log before its next line, as its writer counted them: the
	// lines before the chain forked and its own (what its checkpoints count).
	lines int
	// keyedSeen is set once a line of it verified under the chain key; unkeyedFrom is where its
	// plain lines after the last keyed one (or from the start) begin.
	keyedSeen   bool
	unkeyedFrom *Break
}

// maxWriters bounds how many interleaved chains Verify follows; a log with more is broken
// beyond telling who wrote what.
const maxWriters = 8

// forkWindow is how many of the latest lines a second writer's first line may link back to: its
// writer read the log's last line when it opened, and the first writer may have written this
// many lines before the second wrote its first (a keyed writer writes its first line, the
// audit.chain record, as it starts; a plain one with its first event: minutes of a busy
// replica). Past it the line is reported as a break, not as a second writer. Following it
// holds about 5 MB at most while a start reads a log that long, 12 MB while Verify does. (A
// start's check of an audit.log of 150,000 events, 45 MB: 0.17–0.20 s and 37 MB allocated in
// all on the 2-core test VM, most of it the lines' hashes read.)
const forkWindow = 1 << 17

// linkAt is a line of the log and the chain's state after it.
type linkAt struct {
	file  string
	line  int
	state chainState
}

// keyOf is the first 8 bytes of a line's hash, the ring's index: two lines of one window
// share it by chance once in 10^14 logs, and a keyed chain's hashes are nobody's choice.
func keyOf(h string) (uint64, bool) {
	if len(h) < 16 {
		return 0, false
	}
	var k uint64
	for i := range 16 {
		c := h[i]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		default:
			return 0, false
		}
		k = k<<4 | uint64(c)
	}
	return k, true
}

// place is where a line of the ring is: an index into linkRing.files, and a line number.
type place struct {
	file, line int32
}

// linkRing holds the latest forkWindow lines, indexed by hash, in parallel slices (a start
// reads up to a whole audit.log with it); the chain's state after each only when states is set
// (Verify: a second chain is verified from where it forked; a start's check needs only where).
type linkRing struct {
	states bool
	keys   []uint64
	where  []place
	after  []chainState // with states
	files  []string
	next   int
	index  map[uint64]int32 // hash → its latest place in keys
}

func (r *linkRing) push(h string, l linkAt) {
	k, ok := keyOf(h)
	if !ok {
		return
	}
	if r.index == nil {
		r.index = map[uint64]int32{}
	}
	if len(r.files) == 0 || r.files[len(r.files)-1] != l.file {
		r.files = append(r.files, l.file)
	}
	at := place{file: int32(len(r.files) - 1), line: int32(l.line)}
	i := len(r.keys)
	if i < forkWindow {
		r.keys, r.where = append(r.keys, k), append(r.where, at)
		if r.states {
			r.after = append(r.after, l.state)
		}
	} else {
		i = r.next
		if old := r.keys[i]; r.index[old] == int32(i) {
			delete(r.index, old)
		}
		r.keys[i], r.where[i] = k, at
		if r.states {
			r.after[i] = l.state
		}
		r.next = (r.next + 1) % forkWindow
	}
	r.index[k] = int32(i)
}

// find returns the latest line whose hash is h.
func (r *linkRing) find(h string) (linkAt, bool) {
	k, ok := keyOf(h)
	if !ok {
		return linkAt{}, false
	}
	i, ok := r.index[k]
	if !ok {
		return linkAt{}, false
	}
	l := linkAt{file: r.files[r.where[i].file], line: int(r.where[i].line)}
	if r.states {
		l.state = r.after[i]
	}
	return l, true
}

// writers follows the chains of a log: the one the current line continues, and the others.
type writers struct {
	chainState
	others []chainState
	recent linkRing
	// forked is where the first second chain began, nil while there is one.
	forked *Break
	// origin is where the log starts, when what is read starts with it (a first line with no
	// prev_hash): a second writer that opened the folder empty starts there too.
	origin *linkAt
}

// starts notes that the log starts at file's line n.
func (w *writers) starts(file string, n int) {
	w.origin = &linkAt{file: file, line: n, state: chainState{chain: plainChain}}
}

// follow makes the chain that a line linking to prev continues the current one. It reports
// false when no chain ends in prev: a line is missing or lines were reordered (a break), unless
// the line is a second writer's, whose chain forks from a recent line (then it starts one).
// stored is the line's own hash: a line that repeats a recent one is a copy, not a writer.
func (w *writers) follow(prev, stored, file string, n int) bool {
	if prev == w.prev {
		return true
	}
	for i := range w.others {
		if w.others[i].prev == prev {
			w.chainState, w.others[i] = w.others[i], w.chainState
			return true
		}
	}
	if len(w.others)+1 >= maxWriters {
		return false
	}
	from, ok := w.recent.find(prev)
	where := "continues %s:%d"
	if prev == "" && w.origin != nil {
		from, ok, where = *w.origin, true, "starts the log, as %s:%d does"
	}
	if !ok {
		return false
	}
	if _, repeat := w.recent.find(stored); repeat {
		return false
	}
	w.others = append(w.others, w.chainState)
	w.chainState = from.state
	if w.forked == nil {
		w.forked = &Break{File: file, Line: n, Reason: "two writers: this line " + fmt.Sprintf(where, from.file, from.line) +
			", not the line before it: from here two processes appended to this log at once, each with its " +
			"own chain (two Sandgate replicas, or two runs, on one audit folder)"}
	}
	return true
}

// linked records a line that verified: the current chain now ends in it.
func (w *writers) linked(stored, file string, n int) {
	w.prev = stored
	w.recent.push(stored, linkAt{file: file, line: n, state: w.chainState})
}

// forkIn looks for a second writer's chain in the given files (chain order) by their links
// alone (prev_hash to hash), without recomputing a hash: what the FileSink checks before it
// continues a log. It returns where the second chain starts, or nil.
func forkIn(files []string) (*Break, error) {
	var w writers
	first := true
	for _, path := range files {
		err := scanLines(path, func(n int, line []byte, lineErr error) error {
			if lineErr != nil {
				return nil
			}
			prev, stored, err := linkedHashes(line)
			if err != nil {
				return nil
			}
			switch {
			case first && prev == "":
				w.starts(path, n)
			case !first:
				// A break that is no fork is Verify's to report: the chain goes on from this line.
				w.follow(prev, stored, path, n)
			}
			first = false
			w.linked(stored, path, n)
			if w.forked != nil {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return nil, fmt.Errorf("check the audit log for a second writer: %w", err)
		}
		if w.forked != nil {
			return w.forked, nil
		}
	}
	return nil, nil
}

// ForkedLogError is OpenFileSink's answer for a log whose latest file holds two writers'
// chains: continuing it would carry the fork on, one writer's chain silently abandoned.
type ForkedLogError struct {
	Dir  string
	Fork *Break
}

func (e *ForkedLogError) Error() string {
	return fmt.Sprintf("the audit log in %s was written by two processes at once, and Sandgate does not continue a "+
		"forked log: %s. Check it with 'sandgate audit verify --dir %[1]s', move its files (audit.log and "+
		"audit-*.log) into a folder of their own to keep them, and start again to begin a new log", e.Dir, e.Fork)
}

// checkOneWriter refuses a log whose latest part holds a second writer's chain (forkIn): the
// file the chain continues from (audit.log, or the newest rotated file when audit.log is
// empty), and the rotated file before it when audit.log's first line does not continue that
// file's last (two writers that both rotated). Older files are Verify's to read: a restart
// reads at most two files, whatever the retention.
func checkOneWriter(dir string, files []string) error {
	n := len(files)
	if n == 0 {
		return nil
	}
	scan := files[n-1:]
	if n > 1 && !continues(files[n-1], files[n-2]) {
		scan = files[n-2:]
	}
	fork, err := forkIn(scan)
	if err != nil {
		return err
	}
	if fork != nil {
		return &ForkedLogError{Dir: dir, Fork: fork}
	}
	return nil
}

// continues reports that the first line of the file at path links to the last line of the
// file at before.
func continues(path, before string) bool {
	last, err := lastLineHash(before)
	if err != nil {
		return false
	}
	var prev string
	found := false
	err = scanLines(path, func(_ int, line []byte, _ error) error {
		prev, _, _ = linkedHashes(line)
		found = true
		return errStop
	})
	return (err == nil || errors.Is(err, errStop)) && found && prev == last
}
