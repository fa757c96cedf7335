package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// runPolicyReplay re-evaluates the decision log (or the audit log) under a policy folder and
// prints what would change. Exit codes: 0 done (changes or not), 1 with --fail-on-change when a
// decision changes (or on failure), 2 usage.
func runPolicyReplay(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy replay", "policy replay --policies DIR (--from LOG | --config FILE) [--since 24h] [--sandbox NS/NAME] [--template T] [-o text|json] [--fail-on-change] [--examples N]")
	dir := fs.String("policies", "", "policy folder to replay under (default: the config's policy.dir)")
	from := fs.String("from", "", "decision log file (default: the config's policy.decision_log.file; rotated files next to it are read too), "+
		"or an audit log folder, whose events are decided under --baseline and --policies")
	cfgPath := fs.String("config", "", "config file whose policy.dir, policy.decision_log.file and audit.file.dir to use")
	baseline := fs.String("baseline", "", "for an audit log: the policy folder its calls are compared with (default: the config's policy.dir, else ./policies)")
	since := fs.Duration("since", 0, "replay only decisions logged within this long before now, e.g. 24h")
	sandbox := fs.String("sandbox", "", "replay only this sandbox's decisions, as NAMESPACE/NAME")
	template := fs.String("template", "", "replay only the decisions of this template's sandboxes")
	output := choiceFlag(fs, "o", "text", "output `format`: text or json", "text", "json")
	failOnChange := fs.Bool("fail-on-change", false, "exit 1 when any decision would change")
	examples := fs.Int("examples", 10, "how many changed decisions to show, the first ones in the log")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	opts := policy.ReplayOptions{Examples: max(*examples, 0), Template: *template}
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
	src, err := evidencePaths(*dir, *from, *cfgPath)
	if err != nil {
		return err
	}
	eng, err := loadPolicyFolder(ctx, src.policyDir, "--policies")
	if err != nil {
		return err
	}
	var r *policy.ReplayReport
	if src.auditDir != "" {
		base := *baseline
		if base == "" {
			base = src.servingDir
		}
		baseEng, err := loadPolicyFolder(ctx, base, "--baseline")
		if err != nil {
			return err
		}
		r, err = policy.ReplayAudit(ctx, eng, baseEng, src.auditDir, opts)
		if err != nil {
			return err
		}
	} else if r, err = policy.Replay(ctx, eng, src.decisionLog, opts); err != nil {
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

// loadPolicyFolder loads a policy folder with the decision cache off (every input is seen once).
func loadPolicyFolder(ctx context.Context, dir, flag string) (*policy.Engine, error) {
	eng, err := policy.New(ctx, dir, policy.WithDecisionCache(0))
	if err != nil {
		return nil, err
	}
	if eng.Revision() == "none" {
		return nil, fmt.Errorf("no policy in %s: write .rego files there, or name the folder with %s", dir, flag)
	}
	return eng, nil
}

// evidence is where replay and suggest read what was decided, and the policy folders.
type evidence struct {
	policyDir   string // the folder to replay under (--policies)
	servingDir  string // the config's policy.dir, else ./policies
	decisionLog string // a decision log's active file, or
	auditDir    string // an audit log's folder
}

// evidencePaths applies the config's defaults: --from names a decision log file, an audit log
// folder or an audit log file (told apart by their first line); without it, the config's
// decision log, else its audit log.
func evidencePaths(dir, from, cfgPath string) (evidence, error) {
	var ev evidence
	var cfg *config.Config
	if cfgPath != "" {
		var err error
		if cfg, err = config.Load(cfgPath); err != nil {
			return ev, err
		}
		if cfg.Policy.Bundle.Configured() && dir == "" {
			return ev, fmt.Errorf("config %s serves a bundle (policy.bundle), not a folder: pass the policy folder (a bundle's files, tar xzf bundle.tar.gz) with --dir or --policies", cfgPath)
		}
		ev.servingDir = cfg.Policy.Dir
	}
	if ev.servingDir == "" {
		ev.servingDir = "policies"
	}
	ev.policyDir = cmp.Or(dir, ev.servingDir)
	switch {
	case from != "":
		audit, err := isAuditLog(from)
		if err != nil {
			return ev, err
		}
		if audit {
			ev.auditDir = from
			if st, err := os.Stat(from); err == nil && !st.IsDir() {
				ev.auditDir = filepath.Dir(from)
			}
		} else {
			ev.decisionLog = from
		}
	case cfg != nil && cfg.Policy.DecisionLog.File != "":
		ev.decisionLog = cfg.Policy.DecisionLog.File
	case cfg != nil && cfg.Audit.File.Dir != "":
		ev.auditDir = cfg.Audit.File.Dir
	default:
		return ev, usagef("--from is required (or --config with policy.decision_log.file or audit.file.dir)")
	}
	return ev, nil
}

// isAuditLog tells an audit log (a folder, or a file whose first line is an audit event) from a
// decision log file.
func isAuditLog(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return false, nil // the decision log's rotated files may be all there is: Replay says
		}
		return false, err
	}
	if st.IsDir() {
		return true, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 1<<20)).ReadBytes('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return bytes.Contains(line, []byte(`"prev_hash":`)) && !bytes.Contains(line, []byte(`"decision_id":`)), nil
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
	what := plural(r.Read, "logged decision")
	if r.Source == policy.SourceAuditLog {
		what = plural(r.Read, "audited call") + " (audit log: each decided under baseline revision " + r.Baseline + " and this one)"
	}
	fmt.Fprintf(w, "replayed %d of %s under revision %s in %s (%.0f inputs/s)\n",
		r.Replayed, what, r.Revision, r.Elapsed.Round(time.Millisecond), rate)
	fmt.Fprintf(w, "unchanged %d, allow→deny %d, deny→allow %d, code changed %d\n",
		r.Unchanged, r.AllowToDeny, r.DenyToAllow, r.CodeChanged)
	if r.MaskedChanged > 0 {
		fmt.Fprintf(w, "%d of the changed decisions had masked input (the replay saw %q for those values)\n",
			r.MaskedChanged, policy.MaskedValue)
	}
	if len(r.Changes) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "COUNT\tCHANGE\tKIND\tTEMPLATE\tCODE\tTARGETS")
		for _, c := range r.Changes {
			targets := make([]string, len(c.Targets))
			for i, t := range c.Targets {
				targets[i] = fmt.Sprintf("%s (%d)", t.Target, t.Count)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s → %s\t%s\n", c.Count, c.Direction, c.Kind, c.Template, c.FromCode, c.ToCode, strings.Join(targets, ", "))
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
	} else if o.ReportOnly {
		verdict = "deny, report-only"
	}
	return fmt.Sprintf("%s (%s) %q", verdict, o.Code, o.Reason)
}
