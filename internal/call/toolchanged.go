package call

import (
	"context"
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
	ev := audit.Event{Kind: audit.KindToolChanged, Target: audit.Target{Upstream: upstream, Tool: tool},
		Decision: audit.Decision{Reason: "tool definition differs from its pin (" + changed + "): hidden until pinned again (sandgate policy pin)",
			PolicyRevision: c.opts.Policy.Revision()},
		Outcome: audit.Outcome{Error: audit.ToolChangedCode}}
	ev.AssignID()
	ev.Time = time.Now().UTC()
	if err := c.opts.Audit.Record(&ev); err != nil {
		c.metrics.auditErrors.Add(context.Background(), 1)
		c.log.Error("audit event not recorded", "kind", ev.Kind, "upstream", upstream, "tool", tool, "err", err)
		return err
	}
	return nil
}
