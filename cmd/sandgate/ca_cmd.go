package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/proxy"
)

// runCA handles `sandgate ca init`.
func runCA(ctx context.Context, env *cliEnv, args []string) error {
	return subcommand(ctx, env, "ca", args, map[string]func(context.Context, *cliEnv, []string) error{
		"init": runCAInit,
	})
}

func runCAInit(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "ca init", "ca init --dir DIR [--force]")
	dir := fs.String("dir", "", "folder for ca.crt and ca.key (created with mode 0700)")
	force := fs.Bool("force", false, "replace an existing CA (sandboxes must then trust the new ca.crt)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", errUsage)
	}
	cert, key, err := proxy.InitCA(*dir, *force, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "wrote %s (give it to sandboxes) and %s (mode 0600, keep it in Sandgate)\n", cert, key)
	fmt.Fprintf(env.stdout, "set proxy.ca.cert and proxy.ca.key in the config to use them\n")
	return nil
}
