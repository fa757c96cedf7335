package audit

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Audit first on a full disk (docs/audit.md, "When the disk fills up").
//
// A sink that implements Reserver keeps a reserve of disk space aside (the FileSink: a
// preallocated file next to the log). The writer never owes the sink more than that reserve:
// every event it has accepted and not yet written is counted, in bytes of its line, against
// it. When the disk fills up, the sink draws the space for the lines it owes from the reserve,
// so every accepted event is still written; the writer turns unhealthy (new calls are refused)
// until the sink can restore the reserve whole, once space is freed.
//
// The request path takes a Slot when a call begins, before anything is answered (Reserve):
// a call that gets no slot is refused, and a call that has one is sure its event fits, however
// long its response streams. RecordReserved records the event on its slot.

// SlotBytes is what one call's slot holds: an event line up to this size always fits. A longer
// line takes the rest from the reserve when it can, and otherwise is cut to fit (fitEvent).
const SlotBytes = 2048

// reserveMargin is kept out of the slots for the writer's own lines (chain marker, checkpoints).
const reserveMargin = 16 << 10

// MinReserve is the smallest reserve a sink may keep: the margin and a few slots.
const MinReserve = reserveMargin + 8*SlotBytes

// ErrReserveExhausted is returned by Reserve and Record when the events accepted and not yet
// written, with the slots of the calls in flight, already hold the whole reserve.
var ErrReserveExhausted = errors.New("audit reserve exhausted: too many calls in flight for the reserved disk space")

// Reserver is implemented by sinks that keep disk space aside for the events the writer owes.
type Reserver interface {
	// ReserveBytes is the size of the reserve when whole.
	ReserveBytes() int64
	// Replenish restores the reserve to its full size after WriteBatch drew from it. It returns
	// nil when the reserve is whole, and otherwise why it is not (the disk is still full).
	Replenish() error
}

// Slot is room in the reserve for one call's event, taken by Reserve.
type Slot struct{ bytes int64 }

// Reserve takes a slot for the event of a call about to be answered. It fails while the writer
// is unhealthy (the disk is full, or the sink failing) or when the reserve is all taken; the
// caller refuses the call. A writer whose sink keeps no reserve hands out empty slots while
// healthy.
func (w *Writer) Reserve() (Slot, error) {
	if err := w.Healthy(); err != nil {
		return Slot{}, err
	}
	if w.reserve == 0 {
		return Slot{}, nil
	}
	if !w.take(SlotBytes) {
		return Slot{}, fmt.Errorf("%w (%d bytes owed of %d)", ErrReserveExhausted, w.owed.Load(), w.reserve)
	}
	return Slot{bytes: SlotBytes}, nil
}

// Release gives back a slot whose event will not be recorded.
func (w *Writer) Release(s Slot) { w.owed.Add(-s.bytes) }

// take counts n more bytes owed, if they fit in the reserve.
func (w *Writer) take(n int64) bool {
	for {
		cur := w.owed.Load()
		if cur+n > w.reserve {
			return false
		}
		if w.owed.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// RecordReserved records ev on s, the slot its call took: unlike Record it does not refuse an
// event because the writer is unhealthy, since the slot holds its room. An event whose line is
// longer than the slot takes the difference from the reserve, or is cut to fit when the reserve
// cannot give it. An error (the writer is closed, the queue stayed full) means the event was not
// accepted; the slot is released.
func (w *Writer) RecordReserved(ev *Event, s Slot) error {
	if w.reserve == 0 || s.bytes == 0 {
		return w.Record(ev)
	}
	w.prepare(ev)
	if err := checkEncodable(ev); err != nil {
		w.Release(s)
		w.rejected.Add(1)
		return err
	}
	owed := s.bytes
	// The usual event is surely within its slot (lineBound); only the others are measured.
	if lineBound(ev) > owed {
		if n := lineBytes(ev); n > owed {
			if w.take(n - owed) {
				owed = n
			} else {
				fitEvent(ev, int(owed))
			}
		}
	}
	ev.owed = owed
	if err := w.enqueue(ev); err != nil {
		w.Release(Slot{bytes: owed})
		return err
	}
	return nil
}

// lineBytes is the length of ev's line in the log, newline included, with room for a time of
// any precision and both hashes.
func lineBytes(ev *Event) int64 {
	e := *ev
	e.Time = e.Time.UTC()
	e.PrevHash, e.Hash = "", ""
	var buf [1024]byte
	return int64(len(appendEvent(buf[:0], &e)) + 2*64 + len(".000000000") + 1)
}

// lineBound is a cheap upper bound of lineBytes: six bytes for each byte of a string (the
// longest escape, \u00XX), and room for every member name, number, the time and the hashes.
func lineBound(ev *Event) int64 {
	const fixed = 1024
	n := 0
	for _, s := range [...]string{ev.ID, string(ev.Kind), ev.Identity.Namespace, ev.Identity.Sandbox,
		ev.Identity.Template, ev.Identity.Claim, ev.Identity.SourceIP, ev.Target.Upstream, ev.Target.Tool,
		ev.Target.ArgsSHA256, ev.Target.Method, ev.Target.Host, ev.Target.Path, ev.Target.Route,
		ev.Target.Model, ev.Decision.Reason, ev.Decision.PolicyRevision, ev.Credential, ev.Outcome.Error, ev.Outcome.Detail, ev.TraceID, ev.SpanID} {
		n += len(s)
	}
	for k, v := range ev.Identity.Labels {
		n += len(k) + len(v) + 1 // and a comma, a colon and four quotes: within the six
	}
	if c := ev.CredentialToken; c != nil {
		n += len(c.Provider) + len(c.ID) + 96 // the member names and the time
	}
	return int64(fixed + 6*n)
}

// cutTo is what fitEvent leaves of each string.
const cutTo = 64

// fitEvent cuts ev's strings (their ends replaced by "…") until its line fits in n bytes: the
// event keeps its kind, identity key, decision, status and every number. Cut is rare: a line
// longer than its slot when the reserve is all taken.
func fitEvent(ev *Event, n int) {
	ev.Identity.Labels = nil
	for _, s := range []*string{&ev.Outcome.Detail, &ev.Decision.Reason, &ev.Target.Path, &ev.Target.Tool, &ev.Outcome.Error,
		&ev.Target.Host, &ev.Target.Route, &ev.Target.Model, &ev.Target.Method, &ev.Target.Upstream,
		&ev.Identity.Claim, &ev.Identity.Template, &ev.Identity.Sandbox, &ev.Identity.Namespace,
		&ev.Decision.PolicyRevision, &ev.Credential} {
		if lineBytes(ev) <= int64(n) {
			return
		}
		*s = cut(*s, cutTo)
	}
}

// cut shortens s to at most n bytes, on a rune boundary, marking the cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = strings.ToValidUTF8(s[:n-len("…")], "")
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
