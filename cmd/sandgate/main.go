// Command sandgate is the gateway every AI-agent sandbox talks through: an MCP gateway and an
// egress policy proxy that hold all credentials, decide every call with Rego policies and write
// one audit event per call.
//
//	sandgate serve        run the gateway (admin, MCP and proxy listeners)
//	sandgate policy test  run the Rego tests of a policy folder
//	sandgate policy eval  print the decision for one input or one logged decision
//	sandgate policy replay re-evaluate the decision log under a policy folder, print what changes
//	sandgate policy suggest the least data change for a template, from its decisions
//	sandgate policy pin    pin the upstreams' tool definitions (or --diff: what changed)
//	sandgate audit query  read the audit log with filters
//	sandgate audit verify check the audit log's hash chain and checkpoints
//	sandgate audit keygen write the keys that key the chain and sign checkpoints
//	sandgate ca init      write the CA for TLS interception
//	sandgate netpol       print or apply the NetworkPolicies that confine sandboxes
//	sandgate version      print the version (also: sandgate --version)
//	sandgate help CMD     print a command's usage (also: sandgate CMD --help)
//
// Exit codes: 0 success, 1 failure (for policy replay --fail-on-change: a decision would
// change), 2 usage error, 3 audit verify found a mismatch, 4 audit verify found the log intact
// but less protected than the keys given call for.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes. The top-level usage and README.md list them; keep the three in step.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitBroken  = 3 // audit verify: the log was edited, truncated or reordered
	// exitUnprotected: audit verify found the log intact but without the protection the given
	// keys call for (not keyed under --key-file, no checkpoint under --public-key).
	exitUnprotected = 4
)

// command is a leaf (run set) or a group of subcommands ("audit query", "audit verify").
// run gets the arguments after the command's name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *cliEnv, args []string) error
	subs    []*command
}

// cliEnv is what a command may touch of the outside world, so tests can run commands in-process.
type cliEnv struct {
	stdin          io.Reader // nil reads nothing
	stdout, stderr io.Writer
	getenv         func(string) string
	// now is serve's clock for budget windows (requests per minute, tokens per day); nil is
	// time.Now. Tests pin it so that a window cannot roll over in the middle of a case.
	now func() time.Time
}

func commands() []*command {
	return []*command{
		{name: "serve", summary: "run the gateway: admin, MCP and proxy listeners", run: runServe},
		{name: "policy", summary: "test, evaluate, replay, suggest and pin policies", subs: []*command{
			{name: "test", summary: "run the Rego tests of policy folders (like opa test)", run: runPolicyTest},
			{name: "eval", summary: "print the decision for one input document or logged decision", run: runPolicyEval},
			{name: "replay", summary: "re-evaluate the decision log under a policy folder and count what changes", run: runPolicyReplay},
			{name: "suggest", summary: "suggest the least data change for a template from what its sandboxes did", run: runPolicySuggest},
			{name: "pin", summary: "pin the upstreams' tool definitions in the policy folder (--diff: what changed)", run: runPolicyPin},
		}},
		{name: "audit", summary: "query or verify the audit log", subs: []*command{
			{name: "query", summary: "print audit events, filtered", run: runAuditQuery},
			{name: "verify", summary: "check the hash chain and checkpoints of the audit log", run: runAuditVerify},
			{name: "keygen", summary: "write the audit chain key and the checkpoint signing key pair", run: runAuditKeygen},
		}},
		{name: "ca", summary: "manage the CA that signs intercepted TLS", subs: []*command{
			{name: "init", summary: "write ca.crt and ca.key for TLS interception", run: runCAInit},
		}},
		{name: "netpol", summary: "print or apply the NetworkPolicies that confine sandboxes", run: runNetpol},
		{name: "version", summary: "print the version", run: runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code. Asked-for usage goes to
// stdout with exit 0; an error goes to stderr, printed once, here and nowhere else.
func run(ctx context.Context, env *cliEnv, args []string) int {
	cmds := commands()
	if len(args) == 0 {
		usage(env.stderr, cmds)
		return exitUsage
	}
	switch {
	case isHelpFlag(args[0]), args[0] == "help" && (len(args) == 1 || isHelpFlag(args[1])):
		usage(env.stdout, cmds)
		return exitOK
	case args[0] == "-v", args[0] == "-version", args[0] == "--version":
		args = append([]string{"version"}, args[1:]...)
	case args[0] == "help":
		// "help audit query" is "audit query --help".
		args = append(append([]string(nil), args[1:]...), "--help")
	}
	c, name, rest, err := resolve(cmds, args)
	if err == nil && c.run == nil {
		groupUsage(env.stdout, name, c)
		return exitOK
	}
	if err == nil {
		err = c.run(ctx, env, rest)
	}
	return report(env.stderr, name, err)
}

// resolve finds the command args name. It returns the command, its full name ("sandgate audit
// query") and the arguments after it. A group comes back alone only when help was asked for.
func resolve(cmds []*command, args []string) (c *command, name string, rest []string, err error) {
	name = "sandgate"
	c = find(cmds, args[0])
	if c == nil {
		return nil, name, nil, usagef("unknown command %q (want one of %s)", args[0], names(cmds))
	}
	name += " " + c.name
	rest = args[1:]
	if c.subs == nil {
		return c, name, rest, nil
	}
	if len(rest) == 0 {
		return nil, name, nil, usagef("name a subcommand: %s", names(c.subs))
	}
	if isHelpFlag(rest[0]) || rest[0] == "help" {
		return c, name, nil, nil
	}
	sub := find(c.subs, rest[0])
	if sub == nil {
		return nil, name, nil, usagef("unknown subcommand %q (want one of %s)", rest[0], names(c.subs))
	}
	return sub, name + " " + sub.name, rest[1:], nil
}

func isHelpFlag(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

func find(cmds []*command, name string) *command {
	for _, c := range cmds {
		if c.name == name {
			return c
		}
	}
	return nil
}

func names(cmds []*command) string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.name
	}
	return strings.Join(out, ", ")
}

// report prints err once, prefixed with the command's name, and returns the exit code.
func report(stderr io.Writer, name string, err error) int {
	var ec exitCoder
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return exitUsage
	case errors.As(err, &ec):
		if msg := err.Error(); msg != "" {
			fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		}
		return ec.ExitCode()
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return exitFailure
	}
}

// errUsage matches every usage error (errors.Is): a mistake in the command line; exit code 2.
var errUsage = errors.New("usage error")

type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == errUsage }

// usagef returns a usage error: the command line is wrong, not the world.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
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

func usage(w io.Writer, cmds []*command) {
	fmt.Fprintln(w, "usage: sandgate COMMAND [SUBCOMMAND] [flags]\n\ncommands:")
	row := func(name, summary string) { fmt.Fprintf(w, "  %-14s %s\n", name, summary) }
	for _, c := range cmds {
		if c.subs == nil {
			row(c.name, c.summary)
		}
		for _, s := range c.subs {
			row(c.name+" "+s.name, s.summary)
		}
	}
	row("help COMMAND", "print a command's usage (same as COMMAND --help)")
	fmt.Fprintf(w, `
flags:
  -h, --help     print this usage
  -v, --version  print the version

exit codes:
  %d  success
  %d  failure (an invalid config, a failed policy test, a file that cannot be read, …)
  %d  usage error (unknown command or flag, missing or extra argument)
  %d  audit verify: the log was edited, truncated or reordered
  %d  audit verify: intact, but not keyed (--key-file) or without a checkpoint (--public-key)

Run 'sandgate COMMAND --help' for a command's flags.
`, exitOK, exitFailure, exitUsage, exitBroken, exitUnprotected)
}

func groupUsage(w io.Writer, name string, c *command) {
	fmt.Fprintf(w, "usage: %s SUBCOMMAND [flags]\n\n%s\n\nsubcommands:\n", name, c.summary)
	for _, s := range c.subs {
		fmt.Fprintf(w, "  %-8s %s\n", s.name, s.summary)
	}
	fmt.Fprintf(w, "\nRun '%s SUBCOMMAND --help' for its flags.\n", name)
}

// newFlags returns a FlagSet that reports errors instead of exiting or printing: parseFlags
// prints the usage to stdout for -h/--help, and run prints a flag error once, to stderr.
// name is the command's name after "sandgate" ("audit query"); synopsis its usage line.
func newFlags(env *cliEnv, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(env.stdout, "usage: sandgate %s\n", synopsis)
		if s := summary(name); s != "" {
			fmt.Fprintf(env.stdout, "\n%s\n", s)
		}
		var flags bool
		fs.VisitAll(func(*flag.Flag) { flags = true })
		if flags {
			fmt.Fprintln(env.stdout, "\nflags:")
			var b strings.Builder
			fs.SetOutput(&b)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
			fmt.Fprint(env.stdout, longFlagLine.ReplaceAllString(b.String(), "$1--$2"))
		}
	}
	return fs
}

// summary is the one-line description of the command named "audit query".
func summary(name string) string {
	cmds := commands()
	var c *command
	for _, part := range strings.Fields(name) {
		if c = find(cmds, part); c == nil {
			return ""
		}
		cmds = c.subs
	}
	return c.summary
}

// parseFlags parses args. -h/--help prints the usage and returns flag.ErrHelp (exit 0); a flag
// mistake becomes a usage error, which run prints.
func parseFlags(fs *flag.FlagSet, args []string) error {
	// The flag package calls Usage on errors too; print it only when it was asked for.
	show := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = show
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		show()
		return err
	default:
		return usagef("%s", longFlagInError.ReplaceAllString(err.Error(), "$1--$2"))
	}
}

// The flag package writes every flag with one dash; the docs and the usage lines write a long
// flag with two (--config) and a one-letter flag with one (-o). Both forms parse.
var (
	// A flag's line in PrintDefaults' output: "  -config file".
	longFlagLine = regexp.MustCompile(`(?m)^(  )-([[:alnum:]][[:alnum:]_-]+)`)
	// A flag named in one of the flag package's errors: "flag needs an argument: -dir",
	// "invalid value "x" for flag -limit: …", "flag provided but not defined: -nope".
	longFlagInError = regexp.MustCompile(`^(.*?(?:flag |: |for ))-([[:alnum:]][[:alnum:]_-]+)`)
)

func runVersion(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "version", "version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	fmt.Fprintf(env.stdout, "sandgate %s\n", version)
	return nil
}
