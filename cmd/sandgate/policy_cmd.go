package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// runPolicyTest runs the Rego tests of the folders, like `opa test`.
func runPolicyTest(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy test", "policy test [-v] DIR...")
	verbose := fs.Bool("v", false, "print every test, not only failures")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	dirs := fs.Args()
	if len(dirs) == 0 {
		return usagef("name the policy folder, e.g. sandgate policy test policies/")
	}
	sum, err := policy.RunTests(ctx, env.stdout, *verbose, dirs...)
	if err != nil {
		return err
	}
	if !sum.OK() {
		if sum.Passed+sum.Failed+sum.Errored == 0 {
			return exitError{code: exitFailure, msg: "no tests found (test rules are named test_* in *_test.rego files)"}
		}
		return exitError{code: exitFailure, msg: fmt.Sprintf("%d failed, %d errors", sum.Failed, sum.Errored)}
	}
	return nil
}

// runPolicyEval prints the decision for one input document.
func runPolicyEval(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy eval", "policy eval --input FILE [--dir DIR | --config FILE]")
	input := fs.String("input", "", "input document (JSON or YAML) in the shape of the policy input contract; - reads stdin")
	dir := fs.String("dir", "", "policy folder (default: the config's policy.dir, else ./policies)")
	cfgPath := fs.String("config", "", "config file whose policy.dir to use")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *input == "" {
		return usagef("--input is required")
	}
	policyDir := *dir
	if policyDir == "" && *cfgPath != "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			return err
		}
		policyDir = cfg.Policy.Dir
	}
	if policyDir == "" {
		policyDir = "policies"
	}
	var raw []byte
	var err error
	if *input == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(*input)
	}
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("input %s is not JSON or YAML: %w", *input, err)
	}
	eng, err := policy.New(ctx, policyDir)
	if err != nil {
		return err
	}
	d := eng.DecideDocument(ctx, doc)
	out := map[string]any{
		"allow":    d.Allow,
		"reason":   d.Reason,
		"code":     d.Code,
		"revision": d.Revision,
	}
	if d.Credential != "" {
		out["credential"] = d.Credential
	}
	enc := json.NewEncoder(env.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
