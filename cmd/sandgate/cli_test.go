package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// commandPaths lists every command and subcommand as it is typed: "serve", "audit", "audit query".
func commandPaths() [][]string {
	var out [][]string
	for _, c := range commands() {
		out = append(out, []string{c.name})
		for _, s := range c.subs {
			out = append(out, []string{c.name, s.name})
		}
	}
	return out
}

func TestEveryCommandAnswersHelpAndWrongFlags(t *testing.T) {
	for _, path := range commandPaths() {
		name := strings.Join(path, " ")
		t.Run(name+" --help prints its usage to stdout and exits 0", func(t *testing.T) {
			for _, help := range []string{"--help", "-h"} {
				code, out, errOut := runCLI(t, nil, append(path, help)...)
				assert.Equal(t, 0, code, errOut)
				assert.Contains(t, out, "usage: sandgate "+name)
				assert.Empty(t, errOut)
			}
		})
		t.Run(name+" --help writes long flags with two dashes, as the docs do", func(t *testing.T) {
			_, out, _ := runCLI(t, nil, append(path, "--help")...)
			for _, line := range strings.Split(out, "\n") {
				flagName, ok := strings.CutPrefix(line, "  -")
				if !ok || strings.HasPrefix(flagName, "-") {
					continue
				}
				flagName, _, _ = strings.Cut(flagName, " ")
				flagName, _, _ = strings.Cut(flagName, "\t")
				assert.Len(t, flagName, 1, "a long flag printed with one dash: %q", line)
			}
		})
		t.Run("help "+name+" prints the same usage", func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, append([]string{"help"}, path...)...)
			_, want, _ := runCLI(t, nil, append(path, "--help")...)
			assert.Equal(t, 0, code, errOut)
			assert.Equal(t, want, out)
		})
		t.Run(name+" with a wrong flag exits 2 and says so once", func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, append(path, "--no-such-flag")...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.Equal(t, 1, strings.Count(errOut, "no-such-flag"), errOut)
			assert.Contains(t, errOut, "--no-such-flag", "the error writes the flag as the docs do")
			assert.Contains(t, errOut, "sandgate "+name+": ")
			assert.Contains(t, errOut, "Run 'sandgate "+name+" --help' for usage.")
		})
	}
}

func TestTopLevelUsageVersionAndUnknownCommands(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		wantCode  int
		wantOut   string // in stdout
		wantErr   string // in stderr, exactly once
		emptyOut  bool
		emptyErrs bool
	}{
		{name: "no arguments prints the usage to stderr and exits 2", args: nil, wantCode: 2, wantErr: "usage: sandgate COMMAND", emptyOut: true},
		{name: "--help prints the usage to stdout", args: []string{"--help"}, wantOut: "usage: sandgate COMMAND", emptyErrs: true},
		{name: "-h prints the usage to stdout", args: []string{"-h"}, wantOut: "usage: sandgate COMMAND", emptyErrs: true},
		{name: "help alone prints the usage to stdout", args: []string{"help"}, wantOut: "usage: sandgate COMMAND", emptyErrs: true},
		{name: "help --help prints the usage to stdout", args: []string{"help", "--help"}, wantOut: "usage: sandgate COMMAND", emptyErrs: true},
		{name: "help -h prints the usage to stdout", args: []string{"help", "-h"}, wantOut: "usage: sandgate COMMAND", emptyErrs: true},
		{name: "the usage lists the exit codes", args: []string{"--help"}, wantOut: "3  audit verify: the log was edited", emptyErrs: true},
		{name: "the usage lists sub-subcommands", args: []string{"--help"}, wantOut: "audit verify", emptyErrs: true},
		{name: "version prints the version", args: []string{"version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "--version prints the version", args: []string{"--version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "-version prints the version", args: []string{"-version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "-v prints the version", args: []string{"-v"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "the usage lists -v", args: []string{"--help"}, wantOut: "-v, --version", emptyErrs: true},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`, emptyOut: true},
		{name: "help of an unknown command", args: []string{"help", "frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`, emptyOut: true},
		{name: "unknown subcommand", args: []string{"policy", "nope"}, wantCode: 2, wantErr: `sandgate policy: unknown subcommand "nope" (want one of test, eval, replay, suggest, pin)`, emptyOut: true},
		{name: "a group without a subcommand", args: []string{"audit"}, wantCode: 2, wantErr: "sandgate audit: name a subcommand: query, verify", emptyOut: true},
		{name: "an extra argument is a usage error", args: []string{"ca", "init", "--dir", "x", "extra"}, wantCode: 2, wantErr: `sandgate ca init: unexpected argument "extra"`, emptyOut: true},
		{name: "a missing required flag is a usage error", args: []string{"policy", "eval"}, wantCode: 2, wantErr: "sandgate policy eval: --input is required", emptyOut: true},
		{name: "a flag without its value is a usage error", args: []string{"audit", "verify", "--dir"}, wantCode: 2, wantErr: "flag needs an argument: --dir", emptyOut: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, tc.args...)
			assert.Equal(t, tc.wantCode, code, errOut)
			assert.Contains(t, out, tc.wantOut)
			if tc.wantErr != "" {
				assert.Equal(t, 1, strings.Count(errOut, tc.wantErr), errOut)
			}
			if tc.emptyOut {
				assert.Empty(t, out)
			}
			if tc.emptyErrs {
				assert.Empty(t, errOut)
			}
		})
	}
}

// A flag value the command cannot use is a mistake in the command line, whichever flag it is:
// exit 2 with the usage hint, before any file is read.
func TestABadFlagValueIsAUsageError(t *testing.T) {
	dir := t.TempDir()
	input := writeFile(t, dir, "in.json", `{"kind": "mcp.tools_list"}`)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"audit query --decision", []string{"audit", "query", "--dir", dir, "--decision", "maybe"}, `"maybe"`},
		{"audit query --since", []string{"audit", "query", "--dir", dir, "--since", "yesterday"}, "--since"},
		{"audit query -o", []string{"audit", "query", "--dir", dir, "-o", "yaml"}, "table or json"},
		{"audit query --limit", []string{"audit", "query", "--dir", dir, "--limit", "many"}, "--limit"},
		{"audit query --since after --until", []string{"audit", "query", "--dir", dir, "--since", "1h", "--until", "2h"}, "must be before"},
		{"netpol -o", []string{"netpol", "--rbac", "-o", "xml"}, "yaml or json"},
		{"netpol --management", []string{"netpol", "--template", "t", "--management", "Sometimes"}, "Managed or Unmanaged"},
		{"netpol --service-account", []string{"netpol", "--rbac", "--service-account", "nobody"}, "NS/NAME"},
		{"policy replay -o", []string{"policy", "replay", "--policies", dir, "--from", input, "-o", "xml"}, "text or json"},
		{"policy replay --since", []string{"policy", "replay", "--policies", dir, "--from", input, "--since", "soon"}, "--since"},
		{"policy eval --explain", []string{"policy", "eval", "--dir", dir, "--input", input, "--explain=everything"}, "notes, fails or full"},
		{"serve --check-config", []string{"serve", "--check-config=maybe"}, "--check-config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, tc.args...)
			assert.Equal(t, 2, code, "stdout: %s\nstderr: %s", out, errOut)
			assert.Contains(t, errOut, tc.want)
			assert.Contains(t, errOut, "--help' for usage.")
		})
	}
}
