package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/policy"
)

// runPolicyTest runs the Rego tests of the folders, like `opa test`.
func runPolicyTest(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy test", "policy test [-v] [-o text|json] DIR...")
	verbose := fs.Bool("v", false, "print every test, not only failures")
	output := choiceFlag(fs, "o", "text", "output `format`: text, or json (OPA's JSON report, as opa test --format=json)", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	dirs := fs.Args()
	if len(dirs) == 0 {
		return usagef("name the policy folder, e.g. sandgate policy test policies/")
	}
	var sum policy.TestSummary
	var err error
	if *output == "json" {
		sum, err = policy.RunTestsJSON(ctx, env.stdout, dirs...)
	} else {
		sum, err = policy.RunTests(ctx, env.stdout, *verbose, dirs...)
	}
	if err != nil {
		return err
	}
	if !sum.OK() {
		if sum.Passed+sum.Failed+sum.Errored == 0 {
			return exitError{code: exitFailure, msg: "no tests found (test rules are named test_* in *_test.rego files)"}
		}
		return exitError{code: exitFailure, msg: fmt.Sprintf("%d failed, %s", sum.Failed, plural(sum.Errored, "error"))}
	}
	return nil
}

// runPolicyEval prints the decision for one input document, or re-runs one logged decision.
func runPolicyEval(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy eval", "policy eval (--input FILE | --decision-id ID --from LOG) [--dir DIR | --config FILE] [--explain[=notes|fails|full]]")
	input := fs.String("input", "", "input document (JSON or YAML) in the shape of the policy input contract; - reads stdin")
	decisionID := fs.String("decision-id", "", "re-run the logged decision with this id (the audit event's id)")
	from := fs.String("from", "", "decision log file for --decision-id (default: the config's policy.decision_log.file)")
	dir := fs.String("dir", "", "policy folder (default: the config's policy.dir, else ./policies)")
	cfgPath := fs.String("config", "", "config file whose policy.dir and policy.decision_log.file to use")
	explain := explainFlag("")
	fs.Var(&explain, "explain", "after the decision, print OPA's explanation: notes, fails or full (--explain alone: full)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *input == "" && *decisionID == "":
		return usagef("--input is required (or --decision-id ID to re-run a logged decision)")
	case *input != "" && *decisionID != "":
		return usagef("give --input or --decision-id, not both")
	}
	policyDir, logPath, err := policyPaths(*dir, *from, *cfgPath)
	if err != nil {
		return err
	}
	out := map[string]any{}
	var doc any
	if *decisionID != "" {
		if logPath == "" {
			return usagef("--decision-id needs --from (or --config with policy.decision_log.file)")
		}
		ev, err := policy.FindDecision(logPath, *decisionID)
		if err != nil {
			return err
		}
		doc = *ev.Input
		out["decision_id"], out["timestamp"] = ev.DecisionID, ev.Timestamp
		logged := decisionOutput(policy.DecisionFromResult(ev.Result, ev.Bundles[policy.BundleName].Revision))
		out["logged"] = logged
		if len(ev.Masked) > 0 {
			out["masked"] = ev.Masked
		}
	} else if doc, err = readInputDocument(*input); err != nil {
		return err
	}
	eng, err := policy.New(ctx, policyDir)
	if err != nil {
		return err
	}
	var trace bytes.Buffer
	var d policy.Decision
	if explain != "" {
		if d, err = eng.ExplainDocument(ctx, doc, string(explain), &trace); err != nil {
			return usagef("--explain: %v", err)
		}
	} else {
		d = eng.DecideDocument(ctx, doc)
	}
	result := decisionOutput(d)
	if len(out) == 0 {
		out = result
	} else {
		out["replayed"] = result
		out["changed"] = d.Allow != out["logged"].(map[string]any)["allow"] || d.Code != out["logged"].(map[string]any)["code"]
		out["input"] = doc
	}
	enc := json.NewEncoder(env.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	if explain != "" {
		_, err = fmt.Fprintf(env.stdout, "\nexplanation (%s):\n%s", explain, trace.String())
	}
	return err
}

func decisionOutput(d policy.Decision) map[string]any {
	out := map[string]any{"allow": d.Allow, "reason": d.Reason, "code": d.Code, "revision": d.Revision}
	if d.Credential != "" {
		out["credential"] = d.Credential
	}
	if d.ReportOnly {
		out["enforce"] = false // a report-only template's denial: let through and recorded
	}
	return out
}

func readInputDocument(input string) (any, error) {
	var raw []byte
	var err error
	if input == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(input)
	}
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("input %s is not JSON or YAML: %w", input, err)
	}
	return doc, nil
}

// explainFlag is --explain: alone it means full, like opa eval's --explain.
type explainFlag string

func (f *explainFlag) String() string   { return string(*f) }
func (f *explainFlag) IsBoolFlag() bool { return true }
func (f *explainFlag) Set(s string) error {
	switch s {
	case "true":
		s = policy.ExplainFull
	case "false":
		s = ""
	case policy.ExplainNotes, policy.ExplainFails, policy.ExplainFull:
	default:
		return fmt.Errorf("want %s", orList([]string{policy.ExplainNotes, policy.ExplainFails, policy.ExplainFull}))
	}
	*f = explainFlag(s)
	return nil
}
