package suggest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/policy"
)

// Source calls yield with every decided call it holds, oldest first, until yield fails.
type Source func(ctx context.Context, yield func(*Observation) error) error

// FromDecisionLog reads the decision log whose active file is path (rotated files too). A
// decision's outcome is the policy's: a report-only denial is a denial.
func FromDecisionLog(path string) Source {
	return func(ctx context.Context, yield func(*Observation) error) error {
		return policy.ScanDecisionLog(ctx, path, func(id string, at time.Time, input any, d policy.Decision) error {
			in, ok := input.(map[string]any)
			if !ok {
				return nil
			}
			kind, _ := in["kind"].(string)
			return yield(&Observation{ID: id, Time: at, Kind: audit.Kind(kind), Input: in, Allowed: d.Allow, Code: d.Code})
		})
	}
}

// FromAuditLog reads the audit log in dir: the events of calls policy decides one at a time,
// their input rebuilt from what the event holds (policy.InputFromEvent). A report-only denial
// is its decision.would_deny; a denial's code is its outcome error.
func FromAuditLog(dir string) Source {
	return func(ctx context.Context, yield func(*Observation) error) error {
		_, err := audit.Scan(ctx, dir, audit.Filter{}, func(ev *audit.Event) error {
			switch ev.Kind {
			case audit.KindToolsCall, audit.KindPromptsGet, audit.KindResourcesRead, audit.KindHTTPConnect, audit.KindHTTPRequest:
			default:
				return nil
			}
			in, _ := policy.InputFromEvent(ev)
			o := &Observation{ID: ev.ID, Time: ev.Time, Kind: ev.Kind, Input: normalize(in), Allowed: ev.Decision.Allow}
			switch {
			case ev.Decision.WouldDeny != "":
				o.Allowed, o.Code = false, ev.Decision.WouldDeny
			case !ev.Decision.Allow:
				o.Code = ev.Outcome.Error
			}
			return yield(o)
		})
		return err
	}
}

// normalize gives a rebuilt input the types a decoded JSON document has (numbers as float64),
// as a decision log's input has them.
func normalize(in map[string]any) map[string]any {
	b, err := json.Marshal(in)
	if err != nil {
		return in
	}
	var out map[string]any
	if json.Unmarshal(b, &out) != nil {
		return in
	}
	return out
}

// templateOf is the input's identity.template.
func templateOf(in map[string]any) string {
	id, _ := in["identity"].(map[string]any)
	t, _ := id["template"].(string)
	return t
}

// inputKey identifies an input apart from who sent it, for checking each distinct call once.
func inputKey(in map[string]any) string {
	c := make(map[string]any, len(in))
	for k, v := range in {
		if k != "identity" {
			c[k] = v
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Sprint(c)
	}
	return string(b)
}
