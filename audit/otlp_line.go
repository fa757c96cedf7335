package audit

import (
	"errors"
	"fmt"
	"strings"
	"time"

	// fastjson (already in the build through OPA) reads a line without reflection and, with its
	// parser reused, without allocating: encoding/json's Unmarshal into an Event was 40% of the
	// exporter's CPU per line (BenchmarkExport).
	"github.com/valyala/fastjson"
)

// lineDecoder reads the fields of a log line that a LogRecord carries (the mapping's attributes,
// the severity's inputs, time and trace context) into an Event, for the OTLP exporter. The rest
// of the line is the record's body, as written, and is not decoded. It is not safe for concurrent
// use: the exporter's Send, which the Follower serialises, owns one.
//
// Like ParseLine it checks that the line is a JSON object ending with its "hash" member, and it
// checks the type of each field it reads; it does not check the fields it does not read.
type lineDecoder struct {
	p fastjson.Parser
}

// decode returns the exported fields of line, or why the line is not an event.
func (d *lineDecoder) decode(line []byte) (Event, error) {
	var ev Event
	stored, err := storedHash(line)
	if err != nil {
		return ev, err
	}
	v, err := d.p.ParseBytes(line)
	if err != nil {
		return ev, fmt.Errorf("decode event: %w", err)
	}
	if v.Type() != fastjson.TypeObject {
		return ev, errors.New("decode event: not a JSON object")
	}
	f := fields{v: v}
	ev.ID, ev.Hash = f.str("id"), f.str("hash")
	ev.Kind = Kind(f.str("kind"))
	if t := f.str("time"); t != "" && f.err == nil {
		if ev.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return ev, fmt.Errorf("decode event: time: %w", err)
		}
	}
	id := &ev.Identity
	id.Namespace, id.Sandbox = f.str("identity", "namespace"), f.str("identity", "sandbox")
	id.Template, id.Claim = f.str("identity", "template"), f.str("identity", "claim")
	id.SourceIP, id.Known = f.str("identity", "source_ip"), f.bool("identity", "known")
	t := &ev.Target
	t.Upstream, t.Tool, t.Route = f.str("target", "upstream"), f.str("target", "tool"), f.str("target", "route")
	t.Method, t.Host, t.Path = f.str("target", "method"), f.str("target", "host"), f.str("target", "path")
	t.Model = f.str("target", "model")
	ev.Decision = Decision{Allow: f.bool("decision", "allow"), Reason: f.str("decision", "reason"),
		PolicyRevision: f.str("decision", "policy_revision")}
	ev.Credential, ev.Limits = f.str("credential"), f.str("limits")
	o := &ev.Outcome
	o.Status, o.Error = int(f.int("outcome", "status")), f.str("outcome", "error")
	o.TokensIn, o.TokensOut = f.int("outcome", "tokens_in"), f.int("outcome", "tokens_out")
	ev.TraceID, ev.SpanID = f.str("trace_id"), f.str("span_id")
	if f.err != nil {
		return ev, fmt.Errorf("decode event: %w", f.err)
	}
	if ev.Hash != stored {
		// As in ParseLine: with valid JSON the suffix is always the object's last member.
		return ev, errors.New(`the "hash" member is not the last one`)
	}
	return ev, nil
}

// fields reads typed members of a parsed line; the first wrong type is kept in err. An absent or
// null member reads as the zero value, as encoding/json leaves it.
type fields struct {
	v   *fastjson.Value
	err error
}

// at is the member at path, nil when absent or null.
func (f *fields) at(path ...string) *fastjson.Value {
	m := f.v.Get(path...)
	if m == nil || m.Type() == fastjson.TypeNull {
		return nil
	}
	return m
}

func (f *fields) fail(path []string, err error) {
	if f.err == nil {
		f.err = fmt.Errorf("%s: %w", strings.Join(path, "."), err)
	}
}

func (f *fields) str(path ...string) string {
	m := f.at(path...)
	if m == nil {
		return ""
	}
	b, err := m.StringBytes()
	if err != nil {
		f.fail(path, err)
	}
	return string(b)
}

func (f *fields) bool(path ...string) bool {
	m := f.at(path...)
	if m == nil {
		return false
	}
	b, err := m.Bool()
	if err != nil {
		f.fail(path, err)
	}
	return b
}

func (f *fields) int(path ...string) int64 {
	m := f.at(path...)
	if m == nil {
		return 0
	}
	n, err := m.Int64()
	if err != nil {
		f.fail(path, err)
	}
	return n
}
