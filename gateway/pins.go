package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/pins"
)

// A tool's definition as reviewed is pinned (internal/pins: the pins file of the policy folder,
// data.tool_pins of the serving revision). A tool an upstream lists with another definition is
// hidden from every sandbox, as if it did not exist, and audited once per new definition
// (mcp.tool_changed, with what changed); the rebuild that hides it tells every sandbox whose
// list changed (listchanged.go, listen.go). A tool with no pin follows gateway.unpinned. Two
// upstreams offering one tool name under the same exposed name are both hidden and audited
// (mcp.tool_changed, tool_name_conflict), never first-wins.

// pinPoll is how often the gateway looks for a new policy revision, whose pins may differ.
const pinPoll = 250 * time.Millisecond

// watchPins rebuilds the view when the policy revision changes, until ctx ends.
func (g *Gateway) watchPins(ctx context.Context) {
	if g.opts.Pins == nil {
		return
	}
	t := time.NewTicker(pinPoll)
	defer t.Stop()
	last := g.pins.Revision()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if rev := g.pins.Revision(); rev != last {
			last = rev
			g.rebuild()
		}
	}
}

// pinFilter is whether each tool an upstream lists is shown (no pins: every one).
func (g *Gateway) pinFilter() func(u *upstream, tool string, raw json.RawMessage) bool {
	f, err := g.pins.Pins(context.Background())
	if err != nil {
		g.log.Error("tool pins not readable; no tool is shown until they are", "err", err)
		return func(*upstream, string, json.RawMessage) bool { return false }
	}
	return func(u *upstream, tool string, raw json.RawMessage) bool {
		shown, ch := g.pins.Shown(f, u.cfg.Name, tool, raw)
		if ch != nil {
			_ = g.core.ToolChanged(u.cfg.Name, tool, pins.Differences(*ch.Old, *ch.New))
		}
		return shown
	}
}

// clash audits, once, the tool (or prompt) name two upstreams offer under one exposed name;
// none of them is shown.
func (g *Gateway) clash(kind, name string, cands []candidate) {
	var ups []string
	for _, c := range cands {
		ups = append(ups, c.upstream.cfg.Name+"/"+c.name)
	}
	slices.Sort(ups)
	if g.pins.FirstClash(kind + " " + name + ": " + strings.Join(ups, ", ")) {
		g.log.Warn("two upstreams offer one name: neither is shown; set prefix on one of them", "kind", kind, "name", name, "offered_by", ups)
		_ = g.core.ToolConflict(kind, name, ups)
	}
}
