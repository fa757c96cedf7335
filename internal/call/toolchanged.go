package call

import (
	"context"
	"strings"
	"time"

	"github.com/sandgate/sandgate/audit"
)

// ToolChanged writes the one event of an upstream tool whose live definition differs from its
// pin (internal/pins), which the gateway hides from every sandbox: kind mcp.tool_changed, the
// upstream and the tool (its upstream name), decision deny with why (changed is what differs,
// pins.Differences), outcome tool_changed, the serving policy revision (the pins are policy
// data). It is not a request: no sandbox asked, so no identity, no admission, no call metrics.
// The gateway calls it once per change (a new digest), not once per listing.
func (c *Core) ToolChanged(upstream, tool, changed string) error {
	return c.hiddenTool(audit.Target{Upstream: upstream, Tool: tool}, audit.ToolChangedCode,
		"tool definition differs from its pin ("+changed+"): hidden until pinned again (sandgate policy pin)")
}

// ToolConflict writes the one event of a name (kind "tool" or "prompt") that two upstreams
// offer under the same exposed name, offeredBy each "upstream/own-name": every one of them is
// hidden from every sandbox, never the first served. Kind mcp.tool_changed, outcome
// tool_name_conflict; the target names the exposed name, no upstream.
func (c *Core) ToolConflict(kind, name string, offeredBy []string) error {
	return c.hiddenTool(audit.Target{Tool: name}, audit.ToolNameConflictCode,
		kind+" name offered by more than one upstream ("+strings.Join(offeredBy, ", ")+"): every one is hidden; give one of them a prefix")
}

// hiddenTool writes the event of a tool hidden from every sandbox.
func (c *Core) hiddenTool(t audit.Target, code, reason string) error {
	ev := audit.Event{Kind: audit.KindToolChanged, Target: t,
		Decision: audit.Decision{Reason: reason, PolicyRevision: c.opts.Policy.Revision()},
		Outcome:  audit.Outcome{Error: code}}
	ev.AssignID()
	ev.Time = time.Now().UTC()
	if err := c.opts.Audit.Record(&ev); err != nil {
		c.metrics.auditErrors.Add(context.Background(), 1)
		c.log.Error("audit event not recorded", "kind", ev.Kind, "upstream", t.Upstream, "tool", t.Tool, "err", err)
		return err
	}
	return nil
}
