package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/pins"
)

// runPolicyPin lists the configured upstreams' tools and writes their pins into the policy
// folder's pins file, or with --diff shows how the live definitions differ from the pins
// (exit 1 when they do).
func runPolicyPin(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy pin", "policy pin --config FILE [--policies DIR] [--upstream NAME] [--diff] [-o text|json]")
	cfgPath := fs.String("config", "", "config file whose gateway.upstreams (and credentials) to connect to (required)")
	dir := fs.String("policies", "", "policy folder whose pins file ("+pins.FileName+") to write (default: the config's policy.dir)")
	only := fs.String("upstream", "", "pin only this upstream's tools (the others keep their pins)")
	diff := fs.Bool("diff", false, "write nothing: show how the live definitions differ from the pins, exit 1 when they do")
	output := choiceFlag(fs, "o", "text", "output `format`: text or json", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *cfgPath == "" {
		return usagef("--config is required: pin connects to the config's gateway.upstreams")
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	folder := *dir
	if folder == "" {
		if folder = cfg.Policy.Dir; folder == "" {
			return usagef("the config serves a bundle (policy.bundle): name the policy folder to pin in with --policies")
		}
	}
	creds, err := credential.NewStore(cfg.Credentials, env.getenv, nil)
	if err != nil {
		return err
	}
	live, defs, err := listUpstreams(ctx, cfg.Gateway.Upstreams, *only, creds)
	if err != nil {
		return err
	}
	file, err := pins.Load(folder)
	if err != nil {
		return err
	}
	changes := file.Diff(live)
	if *output == "json" {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"pins_file": filepath.Join(folder, pins.FileName), "changes": orEmpty(changes), "written": !*diff}); err != nil {
			return err
		}
	} else {
		printPinChanges(env.stdout, changes, defs, cfg.Gateway.Unpinned)
	}
	if *diff {
		if len(changes) > 0 {
			return exitError{code: exitFailure, msg: plural(len(changes), "tool definition") + " differ from the pins"}
		}
		return nil
	}
	file.Set(live)
	if err := file.Save(folder); err != nil {
		return err
	}
	if *output == "text" {
		n := 0
		for _, tools := range live {
			n += len(tools)
		}
		fmt.Fprintf(env.stdout, "pinned %s of %s in %s: review it like a policy change\n", plural(n, "tool"),
			plural(len(live), "upstream"), filepath.Join(folder, pins.FileName))
	}
	return nil
}

func orEmpty(c []pins.Change) []pins.Change {
	if c == nil {
		return []pins.Change{}
	}
	return c
}

// listUpstreams pins every tool the upstreams (or the one named) list now.
func listUpstreams(ctx context.Context, ups []config.Upstream, only string, creds pins.Credentials) (map[string]map[string]pins.Pin, map[string]*pins.Definition, error) {
	live := map[string]map[string]pins.Pin{}
	defs := map[string]*pins.Definition{}
	for _, u := range ups {
		if only != "" && u.Name != only {
			continue
		}
		raw, err := pins.ListTools(ctx, u, creds)
		if err != nil {
			return nil, nil, err
		}
		live[u.Name] = map[string]pins.Pin{}
		for _, r := range raw {
			d, err := pins.ParseDefinition(r)
			if err != nil {
				return nil, nil, fmt.Errorf("upstream %s: %w", u.Name, err)
			}
			live[u.Name][d.Name] = d.Pin()
			defs[u.Name+"/"+d.Name] = d
		}
	}
	if only != "" && len(live) == 0 {
		return nil, nil, usagef("no upstream %q in gateway.upstreams", only)
	}
	return live, defs, nil
}

// printPinChanges says what differs from the pins, with the new text of what changed.
func printPinChanges(w io.Writer, changes []pins.Change, defs map[string]*pins.Definition, unpinned string) {
	if len(changes) == 0 {
		fmt.Fprintln(w, "the live tool definitions are the pinned ones")
		return
	}
	for _, c := range changes {
		name := c.Upstream + "/" + c.Tool
		switch c.Verdict {
		case pins.Removed:
			fmt.Fprintf(w, "removed   %s: pinned, no longer listed\n", name)
		case pins.Unpinned.String():
			fmt.Fprintf(w, "unpinned  %s: no pin (gateway.unpinned: %s)\n", name, unpinned)
		default:
			fmt.Fprintf(w, "changed   %s: %s (hidden from every sandbox until pinned again)\n", name, strings.Join(c.Parts, ", "))
			d := defs[name]
			for _, p := range c.Parts {
				switch p {
				case pins.PartDescription:
					fmt.Fprintf(w, "    description was: %q\n    description now: %q\n", c.Old.Description, c.New.Description)
				case pins.PartInputSchema:
					fmt.Fprintf(w, "    inputSchema now: %s\n", orNone(d.InputSchema))
				case pins.PartOutputSchema:
					fmt.Fprintf(w, "    outputSchema now: %s\n", orNone(d.OutputSchema))
				case pins.PartAnnotations:
					fmt.Fprintf(w, "    annotations now: %s\n", orNone(d.Annotations))
				}
			}
		}
	}
	fmt.Fprintf(w, "%s; `sandgate policy pin` pins what is listed now\n", plural(len(changes), "difference"))
}

func orNone(b []byte) string {
	if b == nil {
		return "(none)"
	}
	return string(b)
}
