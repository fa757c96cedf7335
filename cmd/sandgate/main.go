// Command sandgate is the gateway every AI-agent sandbox talks through: an MCP gateway and an
// egress policy proxy that hold all credentials, decide every call with Rego policies and write
// one audit event per call.
//
//	sandgate serve        run the gateway (admin, MCP and proxy listeners)
//	sandgate policy test  run the Rego tests of a policy folder
//	sandgate policy eval  print the decision for one input
//	sandgate audit query  read the audit log with filters
//	sandgate audit verify check the audit log's hash chain and checkpoints
//	sandgate audit keygen write the keys that key the chain and sign checkpoints
//	sandgate ca init      write the CA for TLS interception
//	sandgate netpol       print or apply the NetworkPolicies that confine sandboxes
//	sandgate version      print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// command is one subcommand. run gets the arguments after the command's name.
type command struct {
	summary string
	run     func(ctx context.Context, env *cliEnv, args []string) error
}

// cliEnv is what a command may touch of the outside world, so tests can run commands in-process.
type cliEnv struct {
	stdin          io.Reader // nil reads nothing
	stdout, stderr io.Writer
	getenv         func(string) string
}

// errUsage marks an error whose message is a usage text; the exit code is 2.
var errUsage = errors.New("usage")

func commands() map[string]command {
	return map[string]command{
		"serve":   {"run the gateway: admin, MCP and proxy listeners", runServe},
		"policy":  {"test or evaluate Rego policies (policy test DIR, policy eval --input FILE)", runPolicy},
		"audit":   {"query or verify the audit log, make its keys (audit query, verify, keygen)", runAudit},
		"ca":      {"manage the CA that signs intercepted TLS (ca init --dir DIR)", runCA},
		"netpol":  {"print or apply the NetworkPolicies that confine sandboxes (--apply, --rbac)", runNetpol},
		"version": {"print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code.
func run(ctx context.Context, env *cliEnv, args []string) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.stderr, "sandgate: unknown command %q\n\n", args[0])
		usage(env.stderr, cmds)
		return 2
	}
	err := c.run(ctx, env, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(env.stderr, "sandgate %s: %v\n", args[0], err)
		return 2
	default:
		var ec exitCoder
		if errors.As(err, &ec) {
			if msg := err.Error(); msg != "" {
				fmt.Fprintf(env.stderr, "sandgate %s: %s\n", args[0], msg)
			}
			return ec.ExitCode()
		}
		fmt.Fprintf(env.stderr, "sandgate %s: %v\n", args[0], err)
		return 1
	}
}

// exitCoder is an error that chooses the exit code (for example "verify found a break": 3).
type exitCoder interface {
	error
	ExitCode() int
}

type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }
func (e exitError) ExitCode() int { return e.code }

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: sandgate COMMAND [flags]\n\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sandgate COMMAND -h' for a command's flags.")
}

// newFlags returns a FlagSet that reports errors instead of exiting, writing usage to stderr.
func newFlags(env *cliEnv, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "usage: sandgate %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and turns a flag error into a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// subcommand dispatches "policy test" style second-level commands.
func subcommand(ctx context.Context, env *cliEnv, group string, args []string, subs map[string]func(context.Context, *cliEnv, []string) error) error {
	names := make([]string, 0, len(subs))
	for n := range subs {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) == 0 {
		return fmt.Errorf("%w: sandgate %s %s", errUsage, group, strings.Join(names, "|"))
	}
	f, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("%w: unknown subcommand %q (want one of %s)", errUsage, args[0], strings.Join(names, ", "))
	}
	return f(ctx, env, args[1:])
}

func runVersion(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "version", "version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "sandgate %s\n", version)
	return nil
}
