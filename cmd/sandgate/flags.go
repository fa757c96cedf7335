package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// choice is a flag that takes one value of a closed set. Anything else fails the parse, so it
// is a usage error (exit 2) like every other mistake in the command line, before any file is
// read.
type choice struct {
	value   string
	allowed []string
}

// choiceFlag defines a flag whose value must be one of allowed (def may be "", "not given").
func choiceFlag(fs *flag.FlagSet, name, def, usage string, allowed ...string) *string {
	c := &choice{value: def, allowed: allowed}
	fs.Var(c, name, usage)
	return &c.value
}

func (c *choice) String() string { return c.value }

func (c *choice) Set(s string) error {
	if !slices.Contains(c.allowed, s) {
		return fmt.Errorf("want %s", orList(c.allowed))
	}
	c.value = s
	return nil
}

// orList writes "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// plural writes n and the noun, in the plural unless n is 1: "1 decision", "2 decisions",
// "2 NetworkPolicies".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if stem, ok := strings.CutSuffix(noun, "y"); ok && !strings.HasSuffix(stem, "e") {
		return fmt.Sprintf("%d %sies", n, stem)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
