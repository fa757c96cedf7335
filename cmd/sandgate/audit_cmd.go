package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

// auditDirFlags registers --config and --dir and returns a function that resolves the log folder.
func auditDirFlags(fs *flag.FlagSet) func() (string, error) {
	cfgPath := fs.String("config", "", "read audit.file.dir from this config `file`")
	dir := fs.String("dir", "", "audit log `folder` (instead of --config)")
	return func() (string, error) {
		switch {
		case *dir != "" && *cfgPath != "":
			return "", usagef("give --config or --dir, not both")
		case *dir != "":
			return *dir, nil
		case *cfgPath != "":
			c, err := config.Load(*cfgPath)
			if err != nil {
				return "", err
			}
			return c.Audit.File.Dir, nil
		}
		return "", usagef("give the audit log with --config FILE or --dir DIR")
	}
}

func runAuditQuery(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "audit query", "audit query [--config FILE | --dir DIR | --redis ADDR] [filters] [-o table|json]")
	resolveDir := auditDirFlags(fs)
	queryRedis := auditRedisFlags(fs)
	var f audit.Filter
	fs.StringVar(&f.Namespace, "namespace", "", "only this sandbox namespace")
	fs.StringVar(&f.Sandbox, "sandbox", "", "only this sandbox")
	fs.StringVar(&f.Template, "template", "", "only sandboxes of this template")
	fs.StringVar(&f.Kind, "kind", "", "only this kind (mcp.tools_call …) or family (mcp, http)")
	fs.StringVar(&f.Decision, "decision", "", "only allow or deny")
	fs.StringVar(&f.Tool, "tool", "", "only this MCP tool")
	fs.StringVar(&f.Host, "host", "", "only this HTTP host")
	since := fs.String("since", "", "from this RFC 3339 `time`, or this long ago (1h)")
	until := fs.String("until", "", "before this RFC 3339 `time`, or this long ago")
	fs.IntVar(&f.Limit, "limit", audit.DefaultLimit, "show the newest `N` matches (-1: all)")
	output := fs.String("o", "table", "output `format`: table or json (one event per line)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *output != "table" && *output != "json" {
		return usagef("-o %q: want table or json", *output)
	}
	if f.Limit == 0 {
		return usagef("--limit 0 shows nothing; give N > 0, or -1 for all")
	}
	now := time.Now()
	var err error
	if f.Since, err = audit.ParseTimeFlag(*since, now); err != nil {
		return usagef("--since: %v", err)
	}
	if f.Until, err = audit.ParseTimeFlag(*until, now); err != nil {
		return usagef("--until: %v", err)
	}
	res, err := queryRedis(ctx, f)
	if errors.Is(err, errNoRedis) {
		var dir string
		if dir, err = resolveDir(); err != nil {
			return err
		}
		res, err = audit.Query(ctx, dir, f)
	}
	if err != nil {
		return err
	}
	if *output == "json" {
		err = audit.WriteJSONLines(env.stdout, res.Events)
	} else {
		err = audit.WriteTable(env.stdout, res.Events)
	}
	if err != nil {
		return err
	}
	if res.Malformed > 0 {
		fmt.Fprintf(env.stderr, "warning: skipped %d malformed lines; run 'sandgate audit verify' to locate them\n", res.Malformed)
	}
	return nil
}

func runAuditVerify(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "audit verify", "audit verify [--config FILE | --dir DIR]")
	resolveDir := auditDirFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	dir, err := resolveDir()
	if err != nil {
		return err
	}
	report, err := audit.Verify(dir)
	if err != nil {
		return err
	}
	if !report.OK() {
		return exitError{code: exitBroken, msg: report.String()}
	}
	fmt.Fprintln(env.stdout, report)
	return nil
}

// errNoRedis is auditRedisFlags' answer when --redis was not given.
var errNoRedis = errors.New("no --redis")

// auditRedisFlags registers --redis, --redis-stream, --redis-db and --redis-password-file, and
// returns a query of the audit stream all replicas mirror to (errNoRedis without --redis).
func auditRedisFlags(fs *flag.FlagSet) func(context.Context, audit.Filter) (*audit.QueryResult, error) {
	addr := fs.String("redis", "", "query the Redis Stream of all replicas at `host:port` instead of a folder")
	stream := fs.String("redis-stream", "sandgate:audit", "the audit stream's `key` (redis.audit_stream.name)")
	db := fs.Int("redis-db", 0, "Redis database `number`")
	passwordFile := fs.String("redis-password-file", "", "read the Redis password from this `file`")
	return func(ctx context.Context, f audit.Filter) (*audit.QueryResult, error) {
		if *addr == "" {
			return nil, errNoRedis
		}
		opts := &redis.Options{Addr: *addr, DB: *db, DialTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, DisableIdentity: true}
		if *passwordFile != "" {
			b, err := os.ReadFile(*passwordFile)
			if err != nil {
				return nil, fmt.Errorf("--redis-password-file: %w", err)
			}
			opts.Password = strings.TrimSpace(string(b))
		}
		client := redis.NewClient(opts)
		defer client.Close()
		return audit.QueryRedis(ctx, client, *stream, f)
	}
}
