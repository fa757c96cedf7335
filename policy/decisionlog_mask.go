package policy

import (
	"errors"
	"fmt"
	"strings"
)

// MaskedValue replaces a masked value in a logged decision. Values are replaced, not removed,
// so that a rule testing whether an argument is present replays as it decided; a rule reading
// a masked value sees MaskedValue (replay counts such inputs).
const MaskedValue = "**masked**"

// DefaultMask masks every tool-call argument's value, the part of the input most likely to hold
// a secret a sandbox was given or found.
var DefaultMask = []string{"/input/mcp/arguments/*"}

// maskPointer is one parsed mask: a JSON pointer (RFC 6901) into the event, rooted at /input or
// /result, like OPA's system.log.mask. A last segment "*" means every member of the object (or
// element of the array) found there.
type maskPointer struct {
	raw  string
	root string   // "input" or "result"
	path []string // below the root; unescaped
}

// CheckMask reports what is wrong with one mask pointer, such as "/input/mcp/arguments/token".
func CheckMask(p string) error {
	_, err := parseMask(p)
	return err
}

func parseMask(p string) (maskPointer, error) {
	if !strings.HasPrefix(p, "/") {
		return maskPointer{}, fmt.Errorf("%q is not a JSON pointer (it starts with /input/ or /result/)", p)
	}
	parts := strings.Split(p[1:], "/")
	if parts[0] != "input" && parts[0] != "result" {
		return maskPointer{}, fmt.Errorf("%q: a mask starts with /input/ or /result/", p)
	}
	if len(parts) < 2 || parts[1] == "" {
		return maskPointer{}, fmt.Errorf("%q: name a value below /%s, not the whole document", p, parts[0])
	}
	for i, s := range parts {
		if strings.Contains(s, "*") && (s != "*" || i != len(parts)-1) {
			return maskPointer{}, errors.New(p + `: "*" is allowed only as the whole last segment`)
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return maskPointer{raw: p, root: parts[0], path: parts[1:]}, nil
}
