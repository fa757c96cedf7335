package telemetry

import (
	"sync"
	"sync/atomic"
)

// Other is the label value of everything a LabelSet does not let through.
const Other = "other"

// LabelSet bounds the values of one metric label, so that no sandbox or upstream can mint
// series (each distinct value is a series kept for the life of the process, and an entry of
// an AttrSets cache). Known values pass as they are. Any other value passes only when it is
// shaped like a code (a lowercase word of letters, digits and underscores) and is one of the
// first max such values seen: the codes a policy chooses, which Sandgate does not know in
// advance. Everything else is Other; the text it stands for belongs in the audit event.
type LabelSet struct {
	known map[string]bool
	max   int32
	seen  sync.Map // admitted values beyond known
	n     atomic.Int32
	mu    sync.Mutex
}

// NewLabelSet lets known through, and up to max other code-shaped values.
func NewLabelSet(max int, known ...string) *LabelSet {
	l := &LabelSet{known: make(map[string]bool, len(known)), max: int32(max)}
	for _, k := range known {
		l.known[k] = true
	}
	return l
}

// Value is the label value for v: v itself, or Other.
func (l *LabelSet) Value(v string) string {
	if l.known[v] {
		return v
	}
	if _, ok := l.seen.Load(v); ok {
		return v
	}
	if !codeShaped(v) || l.n.Load() >= l.max {
		return Other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen.Load(v); ok {
		return v
	}
	if l.n.Load() >= l.max {
		return Other
	}
	l.seen.Store(v, struct{}{})
	l.n.Add(1)
	return v
}

// maxCodeLen bounds a code-shaped value.
const maxCodeLen = 64

// codeShaped reports a value like "model_not_allowed": a lowercase letter, then lowercase
// letters, digits and underscores, at most maxCodeLen bytes.
func codeShaped(v string) bool {
	if v == "" || len(v) > maxCodeLen || v[0] < 'a' || v[0] > 'z' {
		return false
	}
	for i := 1; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
