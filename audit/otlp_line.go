package audit

import (
	"errors"
	"fmt"
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

// decode returns the exported fields of line, or why the line is not an event. Each object is
// read in one pass over its members; a member that comes twice is read as encoding/json reads
// it (the last one wins), except "hash", which must come once.
func (d *lineDecoder) decode(line []byte) (Event, error) {
	stored, err := storedHash(line)
	if err != nil {
		return Event{}, err
	}
	v, err := d.p.ParseBytes(line)
	if err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	top, err := v.Object()
	if err != nil {
		return Event{}, errors.New("decode event: not a JSON object")
	}
	var r lineReader
	top.Visit(r.member)
	ev := r.ev
	if r.err != nil {
		return ev, fmt.Errorf("decode event: %w", r.err)
	}
	if r.when != "" {
		if ev.Time, err = time.Parse(time.RFC3339Nano, r.when); err != nil {
			return ev, fmt.Errorf("decode event: time: %w", err)
		}
	}
	if r.hashes != 1 || ev.Hash != stored {
		// As in ParseLine: with valid JSON the suffix is always the object's last member.
		return ev, errors.New(`the "hash" member is not the last one, or not the only one`)
	}
	return ev, nil
}

// lineReader collects the exported fields of one line's members.
type lineReader struct {
	fields
	ev     Event
	when   string // "time", parsed once the members are read
	hashes int
}

// member reads one member of the line's object.
func (r *lineReader) member(k []byte, m *fastjson.Value) {
	ev := &r.ev
	switch string(k) {
	case "id":
		ev.ID = r.str(m, "id")
	case "hash":
		ev.Hash = r.str(m, "hash")
		r.hashes++
	case "kind":
		ev.Kind = Kind(r.str(m, "kind"))
	case "time":
		r.when = r.str(m, "time")
	case "credential":
		ev.Credential = r.str(m, "credential")
	case "credential_token":
		ev.CredentialToken = &CredentialToken{}
		r.object(m, "credential_token", r.credentialToken)
	case "limits":
		ev.Limits = r.str(m, "limits")
	case "trace_id":
		ev.TraceID = r.str(m, "trace_id")
	case "span_id":
		ev.SpanID = r.str(m, "span_id")
	case "identity":
		r.object(m, "identity", r.identity)
	case "target":
		r.object(m, "target", r.target)
	case "decision":
		r.object(m, "decision", r.decision)
	case "outcome":
		r.object(m, "outcome", r.outcome)
	}
}

func (r *lineReader) identity(k []byte, m *fastjson.Value) {
	id := &r.ev.Identity
	switch string(k) {
	case "namespace":
		id.Namespace = r.str(m, "identity.namespace")
	case "sandbox":
		id.Sandbox = r.str(m, "identity.sandbox")
	case "template":
		id.Template = r.str(m, "identity.template")
	case "claim":
		id.Claim = r.str(m, "identity.claim")
	case "source_ip":
		id.SourceIP = r.str(m, "identity.source_ip")
	case "known":
		id.Known = r.bool(m, "identity.known")
	}
}

func (r *lineReader) target(k []byte, m *fastjson.Value) {
	t := &r.ev.Target
	switch string(k) {
	case "upstream":
		t.Upstream = r.str(m, "target.upstream")
	case "tool":
		t.Tool = r.str(m, "target.tool")
	case "route":
		t.Route = r.str(m, "target.route")
	case "method":
		t.Method = r.str(m, "target.method")
	case "host":
		t.Host = r.str(m, "target.host")
	case "path":
		t.Path = r.str(m, "target.path")
	case "model":
		t.Model = r.str(m, "target.model")
	}
}

func (r *lineReader) credentialToken(k []byte, m *fastjson.Value) {
	c := r.ev.CredentialToken
	switch string(k) {
	case "provider":
		c.Provider = r.str(m, "credential_token.provider")
	case "id":
		c.ID = r.str(m, "credential_token.id")
	}
}

func (r *lineReader) decision(k []byte, m *fastjson.Value) {
	d := &r.ev.Decision
	switch string(k) {
	case "allow":
		d.Allow = r.bool(m, "decision.allow")
	case "reason":
		d.Reason = r.str(m, "decision.reason")
	case "policy_revision":
		d.PolicyRevision = r.str(m, "decision.policy_revision")
	case "would_deny":
		d.WouldDeny = r.str(m, "decision.would_deny")
	}
}

func (r *lineReader) outcome(k []byte, m *fastjson.Value) {
	o := &r.ev.Outcome
	switch string(k) {
	case "status":
		o.Status = int(r.int(m, "outcome.status"))
	case "error":
		o.Error = r.str(m, "outcome.error")
	case "tokens_in":
		o.TokensIn = r.int(m, "outcome.tokens_in")
	case "tokens_out":
		o.TokensOut = r.int(m, "outcome.tokens_out")
	}
}

// fields reads typed members of a parsed line; the first wrong type is kept in err. A null
// member reads as the zero value, as encoding/json leaves it.
type fields struct {
	err error
}

func (f *fields) fail(path string, err error) {
	if f.err == nil {
		f.err = fmt.Errorf("%s: %w", path, err)
	}
}

// object visits the members of m, an object or null.
func (f *fields) object(m *fastjson.Value, path string, visit func(k []byte, m *fastjson.Value)) {
	if m.Type() == fastjson.TypeNull {
		return
	}
	o, err := m.Object()
	if err != nil {
		f.fail(path, err)
		return
	}
	o.Visit(visit)
}

func (f *fields) str(m *fastjson.Value, path string) string {
	if m.Type() == fastjson.TypeNull {
		return ""
	}
	b, err := m.StringBytes()
	if err != nil {
		f.fail(path, err)
	}
	return string(b)
}

func (f *fields) bool(m *fastjson.Value, path string) bool {
	if m.Type() == fastjson.TypeNull {
		return false
	}
	b, err := m.Bool()
	if err != nil {
		f.fail(path, err)
	}
	return b
}

func (f *fields) int(m *fastjson.Value, path string) int64 {
	if m.Type() == fastjson.TypeNull {
		return 0
	}
	n, err := m.Int64()
	if err != nil {
		f.fail(path, err)
	}
	return n
}
