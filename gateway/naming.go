package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/sandgate/sandgate/internal/config"
)

// maxNameLen is the longest tool name clients accept (Anthropic and OpenAI tool names are
// limited to 64 characters).
const maxNameLen = 64

// named is one upstream item (tool or prompt) under the name sandboxes see.
type named struct {
	exposed  string
	upstream *upstream
	name     string          // the upstream's own name
	raw      json.RawMessage // its definition as sandboxes see it (view.go)
}

// candidate is an item before naming.
type candidate struct {
	upstream *upstream
	name     string
}

// assignNames gives every candidate its exposed name, deterministically:
//   - prefix always: "<upstream>_<name>";
//   - prefix never: the upstream's name;
//   - prefix on-conflict: the upstream's name, unless another upstream offers the same name,
//     then "<upstream>_<name>";
//   - a name longer than 64 characters is cut to 55 and completed with "_" and 8 hex digits of
//     its SHA-256, so that distinct long names stay distinct;
//   - a name still given to more than one candidate is given to none of them: clash is told
//     of it, and no upstream wins it by its place in the config.
func assignNames(cands []candidate, clash func(name string, cands []candidate)) []named {
	count := map[string]int{}
	for _, c := range cands {
		count[c.name]++
	}
	exposed := make([]string, len(cands))
	by := map[string][]candidate{}
	for i, c := range cands {
		name := c.name
		switch c.upstream.cfg.Prefix {
		case config.PrefixAlways:
			name = c.upstream.cfg.Name + "_" + c.name
		case config.PrefixOnConflict:
			if count[c.name] > 1 {
				name = c.upstream.cfg.Name + "_" + c.name
			}
		}
		exposed[i] = limitName(name)
		by[exposed[i]] = append(by[exposed[i]], c)
	}
	out := make([]named, 0, len(cands))
	for i, c := range cands {
		name := exposed[i]
		switch all := by[name]; {
		case len(all) == 1:
			out = append(out, named{exposed: name, upstream: c.upstream, name: c.name})
		case all[0] == c:
			clash(name, all)
		}
	}
	return out
}

func limitName(name string) string {
	if len(name) <= maxNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:maxNameLen-9] + "_" + hex.EncodeToString(sum[:4])
}
