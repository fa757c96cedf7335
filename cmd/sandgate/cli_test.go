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
		{name: "the usage lists the exit codes", args: []string{"--help"}, wantOut: "3  audit verify: the log was edited", emptyErrs: true},
		{name: "the usage lists sub-subcommands", args: []string{"--help"}, wantOut: "audit verify", emptyErrs: true},
		{name: "version prints the version", args: []string{"version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "--version prints the version", args: []string{"--version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "-version prints the version", args: []string{"-version"}, wantOut: "sandgate " + version + "\n", emptyErrs: true},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`, emptyOut: true},
		{name: "help of an unknown command", args: []string{"help", "frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`, emptyOut: true},
		{name: "unknown subcommand", args: []string{"policy", "nope"}, wantCode: 2, wantErr: `sandgate policy: unknown subcommand "nope" (want one of test, eval, replay)`, emptyOut: true},
		{name: "a group without a subcommand", args: []string{"audit"}, wantCode: 2, wantErr: "sandgate audit: name a subcommand: query, verify", emptyOut: true},
		{name: "an extra argument is a usage error", args: []string{"ca", "init", "--dir", "x", "extra"}, wantCode: 2, wantErr: `sandgate ca init: unexpected argument "extra"`, emptyOut: true},
		{name: "a missing required flag is a usage error", args: []string{"policy", "eval"}, wantCode: 2, wantErr: "sandgate policy eval: --input is required", emptyOut: true},
		{name: "a flag without its value is a usage error", args: []string{"audit", "verify", "--dir"}, wantCode: 2, wantErr: "flag needs an argument: -dir", emptyOut: true},
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
