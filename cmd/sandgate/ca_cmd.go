package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/proxy"
)

func runCAInit(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "ca init", "ca init --dir DIR [--force]")
	dir := fs.String("dir", "", "folder for ca.crt and ca.key (created with mode 0700)")
	force := fs.Bool("force", false, "replace an existing CA (sandboxes must then trust the new ca.crt)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *dir == "" {
		return usagef("--dir is required")
	}
	cert, key, err := proxy.InitCA(*dir, *force, time.Now())
	if err != nil {
		return err
	}
	// No "now set proxy.ca…": `make run` writes the CA that examples/sandgate.yaml already names.
	fmt.Fprintf(env.stdout, "wrote %s (give it to sandboxes) and %s (mode 0600, keep it in Sandgate); "+
		"a config uses them as proxy.ca.cert and proxy.ca.key\n", cert, key)
	return nil
}
