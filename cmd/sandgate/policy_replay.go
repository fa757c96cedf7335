package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// runPolicyReplay re-evaluates the decision log under a policy folder and prints what would
// change. Exit codes: 0 done (changes or not), 1 with --fail-on-change when a decision changes
// (or on failure), 2 usage.
func runPolicyReplay(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy replay", "policy replay --policies DIR --from LOG [--since 24h] [--sandbox NS/NAME] [-o text|json] [--fail-on-change] [--examples N]")
	dir := fs.String("policies", "", "policy folder to replay under (default: the config's policy.dir)")
	from := fs.String("from", "", "decision log file (default: the config's policy.decision_log.file); rotated files next to it are read too")
	cfgPath := fs.String("config", "", "config file whose policy.dir and policy.decision_log.file to use")
	since := fs.Duration("since", 0, "replay only decisions logged within this long before now, e.g. 24h")
	sandbox := fs.String("sandbox", "", "replay only this sandbox's decisions, as NAMESPACE/NAME")
	output := choiceFlag(fs, "o", "text", "output `format`: text or json", "text", "json")
	failOnChange := fs.Bool("fail-on-change", false, "exit 1 when any decision would change")
	examples := fs.Int("examples", 10, "how many changed decisions to show, the first ones in the log")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	opts := policy.ReplayOptions{Examples: max(*examples, 0)}
	if *since > 0 {
		opts.Since = time.Now().Add(-*since)
	}
	if *sandbox != "" {
		ns, name, ok := strings.Cut(*sandbox, "/")
		if !ok || ns == "" || name == "" {
			return usagef("--sandbox %q is not NAMESPACE/NAME", *sandbox)
		}
		opts.Namespace, opts.Sandbox = ns, name
	}
	policyDir, logPath, err := policyPaths(*dir, *from, *cfgPath)
	if err != nil {
		return err
	}
	if logPath == "" {
		return usagef("--from is required (or --config with policy.decision_log.file)")
	}
	eng, err := policy.New(ctx, policyDir, policy.WithDecisionCache(0))
	if err != nil {
		return err
	}
	if eng.Revision() == "none" {
		return fmt.Errorf("no policy in %s: write .rego files there, or name the folder with --policies", policyDir)
	}
	r, err := policy.Replay(ctx, eng, logPath, opts)
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = printReplay(env.stdout, r)
	}
	if err != nil {
		return err
	}
	if *failOnChange && r.Changed() {
		return exitError{code: exitFailure, msg: plural(r.AllowToDeny+r.DenyToAllow+r.CodeChanged, "decision") + " would change"}
	}
	return nil
}

// policyPaths applies the config's defaults to --dir/--policies and --from.
func policyPaths(dir, from, cfgPath string) (string, string, error) {
	if cfgPath != "" && (dir == "" || from == "") {
		cfg, err := config.Load(cfgPath)
		if err != nil {
			return "", "", err
		}
		if dir == "" && cfg.Policy.Bundle.Configured() {
			return "", "", fmt.Errorf("config %s serves a bundle (policy.bundle), not a folder: pass the policy folder (a bundle's files, tar xzf bundle.tar.gz) with --dir or --policies", cfgPath)
		}
		if dir == "" {
			dir = cfg.Policy.Dir
		}
		if from == "" {
			from = cfg.Policy.DecisionLog.File
		}
	}
	if dir == "" {
		dir = "policies"
	}
	return dir, from, nil
}

func printReplay(w io.Writer, r *policy.ReplayReport) error {
	rate := float64(r.Replayed) / max(r.Elapsed.Seconds(), 1e-9)
	fmt.Fprintf(w, "replayed %d of %s under revision %s in %s (%.0f inputs/s)\n",
		r.Replayed, plural(r.Read, "logged decision"), r.Revision, r.Elapsed.Round(time.Millisecond), rate)
	fmt.Fprintf(w, "unchanged %d, allow→deny %d, deny→allow %d, code changed %d\n",
		r.Unchanged, r.AllowToDeny, r.DenyToAllow, r.CodeChanged)
	if r.MaskedChanged > 0 {
		fmt.Fprintf(w, "%d of the changed decisions had masked input (the replay saw %q for those values)\n",
			r.MaskedChanged, policy.MaskedValue)
	}
	if len(r.Changes) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "COUNT\tCHANGE\tKIND\tTEMPLATE\tCODE")
		for _, c := range r.Changes {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s → %s\n", c.Count, c.Direction, c.Kind, c.Template, c.FromCode, c.ToCode)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Examples) > 0 {
		fmt.Fprintf(w, "\nfirst %s:\n", plural(len(r.Examples), "changed decision"))
		for _, ex := range r.Examples {
			fmt.Fprintf(w, "  %s  %s  %s  %s %s\n    logged:   %s\n    replayed: %s\n", ex.DecisionID,
				ex.Time.Format(time.RFC3339), ex.Sandbox, ex.Kind, ex.Target, outcomeText(ex.Logged), outcomeText(ex.Replayed))
		}
	}
	_, err := fmt.Fprint(w, "")
	return err
}

func outcomeText(o policy.Outcome) string {
	verdict := "deny"
	if o.Allow {
		verdict = "allow"
	}
	return fmt.Sprintf("%s (%s) %q", verdict, o.Code, o.Reason)
}
