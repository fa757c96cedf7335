package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemberReadsAsEncodingJSONDoes(t *testing.T) {
	tests := []struct {
		name, obj, key, want string
	}{
		{"the member of that name", `{"a":1,"arguments":{"x":2}}`, "arguments", `{"x":2}`},
		{"a member in other letter case", `{"ARGUMENTS":[1]}`, "arguments", `[1]`},
		{"a member with escapes", `{"\u0061rguments":"s"}`, "arguments", `"s"`},
		{"no such member", `{"a":1}`, "arguments", ``},
		{"not an object", `[1]`, "arguments", ``},
		{"nothing", ``, "arguments", ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(member([]byte(tt.obj), tt.key)))
		})
	}
}

func TestPolicyArgumentsKeepNumbersAsWritten(t *testing.T) {
	var req mcp.CallToolRequest
	require.NoError(t, json.Unmarshal([]byte(`{"name":"t","arguments":{"n":9007199254740993,"f":1.50,"s":"x"}}`), &req.Params))
	args, err := policyArguments(req)
	require.NoError(t, err)
	assert.Equal(t, json.Number("9007199254740993"), args["n"])
	assert.Equal(t, json.Number("1.50"), args["f"])
	assert.Equal(t, "x", args["s"])

	in := mcp.CallToolRequest{}
	in.Params.Arguments = map[string]any{"k": "v"}
	args, err = policyArguments(in)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"k": "v"}, args, "an in-process request has no raw arguments")
}

// BenchmarkOneReading is the guard's one-reading check (readOnce) of a typical tools/call.
func BenchmarkOneReading(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"create_pull_request",` +
		`"arguments":{"owner":"acme","repo":"api","title":"Fix the flaky test","head":"fix/flaky","base":"main",` +
		`"body":"The test waited on a sleep; it now polls with a deadline.\n\nCloses #12.","draft":false,"labels":["ci","tests"]},` +
		`"_meta":{"progressToken":7}}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if rf := readOnce(body, "tools/call"); rf != nil {
			b.Fatal(rf.Reason)
		}
	}
}

// freshArgs decodes raw as policyArguments did before its decoders were reused: a new
// decoder for every call.
func freshArgs(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var args map[string]any
	err := d.Decode(&args)
	return args, err
}

// One argsDecoder reads call after call exactly as a fresh decoder reads each: the same
// arguments, the same error, whatever came before (a failure, bytes after a value, a value
// that is not an object).
func TestArgsDecoderAgreesWithAFreshOne(t *testing.T) {
	inputs := []string{`{"a":1}`, `{"n":9007199254740993,"f":1.50,"s":"x","o":{"d":[1,{"e":null}]}}`, `{}`,
		`{"a":1} `, `{"a":1}{"b":2}`, `{"a":`, `[1,2]`, `5`, `"s"`, `null`, `{"a":"\u00e9"}`, `{"x":true}`, `{"a":1}x`}
	for _, first := range inputs {
		for _, second := range inputs {
			d := newArgsDecoder()
			for _, raw := range []string{first, second, `{"k":"v"}`} {
				if !d.ok {
					d = newArgsDecoder() // policyArguments takes another from the pool
				}
				got, gotErr := d.decode([]byte(raw))
				want, wantErr := freshArgs([]byte(raw))
				require.Equal(t, wantErr == nil, gotErr == nil, "%q after %q: %v / %v", raw, first, gotErr, wantErr)
				if wantErr != nil {
					assert.Equal(t, wantErr.Error(), gotErr.Error(), "%q after %q", raw, first)
					continue
				}
				assert.Equal(t, want, got, "%q after %q", raw, first)
			}
		}
	}
}

// FuzzArgsDecoder holds a reused argsDecoder to a fresh json.Decoder on any two inputs in turn.
func FuzzArgsDecoder(f *testing.F) {
	f.Add([]byte(`{"a":1}`), []byte(`{"b":[1.0,2e3]}`))
	f.Add([]byte(`{"a":1} `), []byte(`{"b":"\ud83d\ude00"}`))
	f.Add([]byte(`{"a":`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		d := newArgsDecoder()
		for _, raw := range [][]byte{a, b} {
			if !d.ok {
				d = newArgsDecoder()
			}
			got, gotErr := d.decode(raw)
			want, wantErr := freshArgs(raw)
			if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
				t.Fatalf("%q: error %v, a fresh decoder's %v", raw, gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: %#v, a fresh decoder's %#v", raw, got, want)
			}
		}
	})
}

func TestHasNumber(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"s":"x","b":true,"n":null,"a":["y",{"o":false}]}`:    false,
		`{"digits in a string":"1-2","escaped quote":"\"3\\"}`: false,
		`{"k":"\u0031"}`:   false,
		`{"n":1}`:          true,
		`{"a":["x",-0.5]}`: true,
		`{"s":"\\","n":2}`: true, // the string ends after an escaped backslash
		`{"e":"\"","n":0}`: true,
	} {
		assert.Equal(t, want, hasNumber([]byte(raw)), raw)
	}
}

// FuzzPolicyArgumentsAgreeWithAFreshDecoder: whatever the arguments, policy reads of a message
// the guard lets through exactly what a fresh json.Decoder with UseNumber reads of the bytes the
// upstream gets, whether policyArguments decoded them again or took mcp-go's reading.
func FuzzPolicyArgumentsAgreeWithAFreshDecoder(f *testing.F) {
	for _, raw := range []string{`{"message":"hello"}`, `{"n":9007199254740993}`, `{"a":{"b":["c",true,null]}}`,
		`{"s":"\"1"}`, `{"A":"x","a":"y"}`, `{"k":"\ud800"}`, `{}`, `{"f":-1e400}`} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":` + string(raw) + `}}`)
		var msg struct {
			Params json.RawMessage `json:"params"`
		}
		if json.Unmarshal(body, &msg) != nil || readOnce(body, "tools/call") != nil {
			return // refused before policy reads it
		}
		var req mcp.CallToolRequest
		if json.Unmarshal(msg.Params, &req.Params) != nil {
			return // mcp-go answers invalid params
		}
		got, gotErr := policyArguments(req)
		want, wantErr := freshArgs(req.Params.RawArguments)
		if string(req.Params.RawArguments) == "null" || len(req.Params.RawArguments) == 0 {
			want, wantErr = req.GetArguments(), nil
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%q: error %v, a fresh decoder's %v", raw, gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %#v, a fresh decoder's %#v", raw, got, want)
		}
	})
}

// BenchmarkPolicyArguments reads a tools/call's arguments for policy with the pool's decoders
// and, for comparison, with a fresh decoder each time (as before the pool).
func BenchmarkPolicyArguments(b *testing.B) {
	var req mcp.CallToolRequest
	require.NoError(b, json.Unmarshal([]byte(`{"name":"t","arguments":{"owner":"acme","repo":"api","n":42,"labels":["ci"]}}`), &req.Params))
	var strs mcp.CallToolRequest
	require.NoError(b, json.Unmarshal([]byte(`{"name":"t","arguments":{"owner":"acme","repo":"api","title":"Fix it","labels":["ci"]}}`), &strs.Params))
	for _, bc := range []struct {
		name string
		read func() (map[string]any, error)
	}{
		{"pooled", func() (map[string]any, error) { return policyArguments(req) }},
		{"fresh-decoder", func() (map[string]any, error) { return freshArgs(req.Params.RawArguments) }},
		{"no-number", func() (map[string]any, error) { return policyArguments(strs) }},
		{"no-number-decoded", func() (map[string]any, error) { return freshArgs(strs.Params.RawArguments) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
