package pins

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/internal/atomicfile"
)

// FileName is the pins file in the policy folder. It is YAML under the one key tool_pins, so the
// policy engine and `opa test` load it as data.tool_pins (a policy may read it) and its changes
// are part of the policy revision.
const FileName = "tool-pins.yaml"

// MaxFileBytes bounds the pins file Load and Parse read.
const MaxFileBytes = 8 << 20

// File is the pins of every upstream: upstream name → tool name (the upstream's own, before any
// prefix) → pin.
type File struct {
	Tools map[string]map[string]Pin `json:"tool_pins"`
}

const header = `# Pinned MCP tool definitions: a digest of each upstream tool's name, description, inputSchema,
# outputSchema and annotations as reviewed. A tool whose live definition differs from its pin is
# hidden from every sandbox (audited as mcp.tool_changed) until it is pinned again; a tool with no
# pin follows gateway.unpinned (allow or hide). Written by ` + "`sandgate policy pin`" + `; review a change to
# this file like a change to the policies (` + "`sandgate policy pin --diff`" + ` shows what changed).
`

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Parse reads a pins file. Unknown keys, a digest that is not sha256:<64 hex>, an empty name,
// or a file over MaxFileBytes are errors naming where.
func Parse(b []byte) (*File, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("pins file of %d bytes is over the %d-byte bound", len(b), MaxFileBytes)
	}
	f := &File{}
	if err := yaml.UnmarshalStrict(b, f); err != nil {
		return nil, fmt.Errorf("pins file: %w", err)
	}
	if f.Tools == nil {
		f.Tools = map[string]map[string]Pin{}
	}
	for upstream, tools := range f.Tools {
		if upstream == "" {
			return nil, errors.New("pins file: tool_pins has an empty upstream name")
		}
		for tool, p := range tools {
			where := fmt.Sprintf("tool_pins.%s.%s", upstream, tool)
			if tool == "" {
				return nil, fmt.Errorf("pins file: tool_pins.%s has an empty tool name", upstream)
			}
			if !digestPattern.MatchString(p.Digest) {
				return nil, fmt.Errorf("pins file: %s.digest %q is not sha256:<64 hex digits>", where, p.Digest)
			}
			for _, part := range []struct{ name, v string }{{"input_schema", p.InputSchema}, {"output_schema", p.OutputSchema}, {"annotations", p.Annotations}} {
				if part.v != "" && !digestPattern.MatchString(part.v) {
					return nil, fmt.Errorf("pins file: %s.%s %q is not sha256:<64 hex digits>", where, part.name, part.v)
				}
			}
		}
	}
	return f, nil
}

// Marshal writes the file: a header that says what it is, then the pins in name order.
func (f *File) Marshal() ([]byte, error) {
	tools := f.Tools
	if tools == nil {
		tools = map[string]map[string]Pin{}
	}
	b, err := yaml.Marshal(struct {
		Tools map[string]map[string]Pin `json:"tool_pins"`
	}{tools}) // sigs.k8s.io/yaml writes map keys sorted
	if err != nil {
		return nil, fmt.Errorf("write pins: %w", err)
	}
	return append([]byte(header), b...), nil
}

// Load reads dir's pins file; a folder without one has no pins (an empty File, no error).
func Load(dir string) (*File, error) {
	path := filepath.Join(dir, FileName)
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &File{Tools: map[string]map[string]Pin{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pins: %w", err)
	}
	if st.Size() > MaxFileBytes {
		return nil, fmt.Errorf("pins file %s of %d bytes is over the %d-byte bound", path, st.Size(), MaxFileBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read pins: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Save writes the file into dir, atomically (a watching engine never reads half of it).
func (f *File) Save(dir string) error {
	b, err := f.Marshal()
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, FileName), b, 0o644)
}

// Verdict is what a live definition is against the pins.
type Verdict int

// Verdicts.
const (
	// Pinned: the definition is the pinned one.
	Pinned Verdict = iota
	// Unpinned: the tool has no pin (gateway.unpinned decides).
	Unpinned
	// Changed: the definition differs from its pin; the tool is hidden.
	Changed
)

func (v Verdict) String() string {
	return [...]string{"pinned", "unpinned", "changed"}[v]
}

// Change is a difference between the pins and what an upstream lists.
type Change struct {
	Upstream string `json:"upstream"`
	Tool     string `json:"tool"`
	// Verdict is Changed, Unpinned (listed, no pin) or Removed (pinned, no longer listed).
	Verdict string `json:"verdict"`
	// Parts names what differs: description, inputSchema, outputSchema, annotations.
	Parts []string `json:"parts,omitempty"`
	Old   *Pin     `json:"old,omitempty"`
	New   *Pin     `json:"new,omitempty"`
}

// Removed is the Verdict word of a pinned tool the upstream no longer lists.
const Removed = "removed"

// Check is the verdict for the definition an upstream lists (its own tool name, before any
// prefix), and the change when it is not Pinned. The gateway audits a Changed tool once per
// new digest (Change.New.Digest) and hides it.
func (f *File) Check(upstream string, live Pin, tool string) (Verdict, *Change) {
	old, ok := f.Tools[upstream][tool]
	switch {
	case !ok:
		return Unpinned, &Change{Upstream: upstream, Tool: tool, Verdict: Unpinned.String(), New: &live}
	case old.Digest == live.Digest:
		return Pinned, nil
	}
	return Changed, &Change{Upstream: upstream, Tool: tool, Verdict: Changed.String(), Parts: describe(old, live), Old: &old, New: &live}
}

// Visible says whether a tool with verdict v is shown to sandboxes, unpinned being
// gateway.unpinned ("allow" or "hide").
func Visible(v Verdict, unpinned string) bool {
	switch v {
	case Pinned:
		return true
	case Unpinned:
		return unpinned != UnpinnedHide
	}
	return false
}

// gateway.unpinned values.
const (
	UnpinnedAllow = "allow"
	UnpinnedHide  = "hide"
)

// Diff lists how the live definitions of the upstreams in live (upstream → tool → pin) differ
// from the file: changed, unpinned, and removed tools, in name order. Upstreams not in live are
// not compared.
func (f *File) Diff(live map[string]map[string]Pin) []Change {
	var out []Change
	for upstream, tools := range live {
		for tool, p := range tools {
			if v, c := f.Check(upstream, p, tool); v != Pinned {
				out = append(out, *c)
			}
		}
		for tool, old := range f.Tools[upstream] {
			if _, ok := tools[tool]; !ok {
				out = append(out, Change{Upstream: upstream, Tool: tool, Verdict: Removed, Old: &old})
			}
		}
	}
	slices.SortFunc(out, func(a, b Change) int {
		return cmp.Or(strings.Compare(a.Upstream, b.Upstream), strings.Compare(a.Tool, b.Tool))
	})
	return out
}

// Set replaces the pins of each upstream in live with the live ones (tools no longer listed
// lose their pin); other upstreams keep theirs.
func (f *File) Set(live map[string]map[string]Pin) {
	if f.Tools == nil {
		f.Tools = map[string]map[string]Pin{}
	}
	for upstream, tools := range live {
		m := make(map[string]Pin, len(tools))
		for k, v := range tools {
			m[k] = v
		}
		f.Tools[upstream] = m
	}
}

// FromData is the pins a policy revision holds as data.tool_pins (nil: none), checked as Parse
// checks a file.
func FromData(v any) (*File, error) {
	if v == nil {
		return &File{Tools: map[string]map[string]Pin{}}, nil
	}
	b, err := json.Marshal(map[string]any{"tool_pins": v})
	if err != nil {
		return nil, fmt.Errorf("pins in the policy data: %w", err)
	}
	return Parse(b)
}
