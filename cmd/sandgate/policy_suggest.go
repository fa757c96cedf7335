package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/suggest"
)

// runPolicySuggest prints the smallest change to a template's data that would have allowed what
// its sandboxes were denied, and the entries they never used, with the evidence of each, and
// with --out writes the policy folder with the change and its tests. Nothing is applied.
func runPolicySuggest(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "policy suggest", "policy suggest --template T [--since 7d] [--from decisions|audit] [--config FILE] [--log PATH] [--policies DIR] [--out DIR] [-o text|json]")
	template := fs.String("template", "", "the sandbox template to suggest for (required)")
	since := fs.String("since", "", "read only calls within this long before now: a duration (90m, 24h) or days (7d)")
	from := choiceFlag(fs, "from", "decisions", "what to read: `decisions` (the decision log, every input whole) or audit (the audit log)", "decisions", "audit")
	cfgPath := fs.String("config", "", "config file whose policy.dir, policy.decision_log.file and audit.file.dir to use")
	logPath := fs.String("log", "", "the decision log file, or the audit log folder (instead of the config's)")
	dir := fs.String("policies", "", "the serving policy folder whose data to change (default: the config's policy.dir, else ./policies)")
	out := fs.String("out", "", "write a copy of the policy folder with the change and its tests here (a new folder)")
	output := choiceFlag(fs, "o", "text", "output `format`: text or json", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *template == "" {
		return usagef("--template is required: the template whose calls to read, e.g. --template triage-agent")
	}
	opts := suggest.Options{Template: *template, PolicyDir: *dir}
	if *since != "" {
		d, err := parseSince(*since)
		if err != nil {
			return usagef("--since: %v", err)
		}
		opts.Since = time.Now().Add(-d)
	}
	path := *logPath
	if *cfgPath != "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			return err
		}
		if opts.PolicyDir == "" {
			opts.PolicyDir = cfg.Policy.Dir
		}
		if path == "" && *from == "decisions" {
			path = cfg.Policy.DecisionLog.File
		}
		if path == "" && *from == "audit" {
			path = cfg.Audit.File.Dir
		}
	}
	if opts.PolicyDir == "" {
		opts.PolicyDir = "policies"
	}
	if path == "" {
		return usagef("name the %s with --log, or give --config (policy.decision_log.file, audit.file.dir)", map[string]string{
			"decisions": "decision log file", "audit": "audit log folder"}[*from])
	}
	src := suggest.FromDecisionLog(path)
	if *from == "audit" {
		src = suggest.FromAuditLog(path)
	}
	s, err := suggest.Suggest(ctx, opts, src)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := s.Write(opts.PolicyDir, *out); err != nil {
			return err
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	return printSuggestion(env.stdout, s, *from, path, opts.PolicyDir, *out)
}

// parseSince reads a duration, or a whole number of days ("7d").
func parseSince(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a number of days such as 7d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration such as 24h or 7d", s)
	}
	return d, nil
}

func printSuggestion(w io.Writer, s *suggest.Suggestion, from, path, dir, out string) error {
	source := map[string]string{"decisions": "decision log", "audit": "audit log"}[from]
	if s.Decisions == 0 {
		fmt.Fprintf(w, "no decisions of template %s in the %s %s: nothing to suggest (is its sandbox calling, and the log on?)\n", s.Template, source, path)
		return nil
	}
	fmt.Fprintf(w, "template %s: %s in the %s %s, %s … %s; data in %s/%s\n", s.Template, plural(s.Decisions, "decision"),
		source, path, s.First.UTC().Format(time.RFC3339), s.Last.UTC().Format(time.RFC3339), strings.TrimSuffix(dir, "/"), s.DataFile)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	section := func(title string, n int) {
		if n > 0 {
			fmt.Fprintf(tw, "\n%s\n", title)
		}
	}
	section("add, to allow what was denied:", len(s.Add))
	for _, e := range s.Add {
		fmt.Fprintf(tw, "  + %s\t%s%s\n", e, e.Evidence.Summary("denied"), noTest(e))
	}
	section("remove, granted and never used:", len(s.Remove))
	for _, e := range s.Remove {
		fmt.Fprintf(tw, "  - %s\tno call used it in these %s%s\n", e, plural(s.Decisions, "decision"), noTest(e))
	}
	section("not a data change:", len(s.Unlifted))
	for _, u := range s.Unlifted {
		fmt.Fprintf(tw, "  ! %s %s\t%s: %s\n", u.Kind, u.Target, u.Evidence.Summary("denied"), u.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if s.Withheld != "" {
		fmt.Fprintf(w, "\nremovals withheld: %s\n", s.Withheld)
	}
	if s.Diff == "" {
		fmt.Fprintln(w, "\nno change to the data")
		return nil
	}
	fmt.Fprintf(w, "\n%s", s.Diff)
	if s.ReportOnly {
		fmt.Fprintf(w, "\ntemplate %s is in report-only mode (enforce: false): its denials are let through; remove enforce: false to enforce.\n", s.Template)
	}
	if out == "" {
		fmt.Fprintf(w, "\nnothing was applied; --out DIR writes the policy folder with this change and its tests (%s)\n", s.TestFile)
		return nil
	}
	_, err := fmt.Fprintf(w, "\nwrote %s: %s with the change and %s; nothing was applied to %s. Check it:\n  sandgate policy test %s\n  sandgate policy replay --policies %s --config …\n",
		out, s.DataFile, s.TestFile, dir, out, out)
	return err
}

func noTest(e suggest.Entry) string {
	if e.NoTest == "" {
		return ""
	}
	return " (no test: " + e.NoTest + ")"
}
