package pins

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
)

// Source is where a Gate reads the pins: the serving policy revision, whose data.tool_pins
// is the pins file (*policy.Engine).
type Source interface {
	Revision() string
	Data(ctx context.Context, path ...string) (any, error)
}

// Gate decides which tools an upstream lists are shown, by their pins: the pins of the serving
// revision (read anew when it changes), gateway.unpinned for a tool with no pin. It remembers
// what it told, so that a change is reported once per new definition.
type Gate struct {
	src      Source
	unpinned string

	mu       sync.Mutex
	revision string
	file     *File
	told     map[string]string // "upstream\x00tool" → the changed digest last reported
	clashes  map[string]bool
}

// NewGate is a gate reading the pins of src (nil: there are none, every tool is shown);
// unpinned is gateway.unpinned.
func NewGate(src Source, unpinned string) *Gate {
	return &Gate{src: src, unpinned: unpinned, told: map[string]string{}, clashes: map[string]bool{}}
}

// Revision is the serving revision of the gate's source ("" without one).
func (g *Gate) Revision() string {
	if g.src == nil {
		return ""
	}
	return g.src.Revision()
}

// Pins are the pins of the serving revision; an error says they cannot be read (a caller
// shows no tool then: fail closed).
func (g *Gate) Pins(ctx context.Context) (*File, error) {
	if g.src == nil {
		return nil, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rev := g.src.Revision()
	if g.file != nil && rev == g.revision {
		return g.file, nil
	}
	v, err := g.src.Data(ctx, "tool_pins")
	if err != nil {
		return nil, fmt.Errorf("tool pins of policy revision %s: %w", rev, err)
	}
	f, err := FromData(v)
	if err != nil {
		return nil, fmt.Errorf("tool pins of policy revision %s: %w", rev, err)
	}
	g.file, g.revision = f, rev
	return f, nil
}

// Shown reports whether upstream's tool (its own name, definition raw as listed) is shown
// under f (nil: no pins, every tool is), and the change to report when its definition differs
// from its pin and was not reported before.
func (g *Gate) Shown(f *File, upstream, tool string, raw json.RawMessage) (bool, *Change) {
	if f == nil {
		return true, nil
	}
	p, err := PinOf(raw)
	if err != nil {
		return false, nil // a definition that cannot be pinned is never shown
	}
	v, ch := f.Check(upstream, p, tool)
	if v != Changed {
		return Visible(v, g.unpinned), nil
	}
	key := upstream + "\x00" + tool
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.told[key] == ch.New.Digest {
		return false, nil
	}
	g.told[key] = ch.New.Digest
	return false, ch
}

// FirstClash reports whether a name conflict, by its description, is seen the first time.
func (g *Gate) FirstClash(desc string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := g.clashes[desc]
	g.clashes[desc] = true
	return !seen
}
