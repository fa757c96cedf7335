package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/redisconn"
)

// auditDirFlags registers --config and --dir and returns a function that resolves the log folder
// and, with --config, the config.
func auditDirFlags(fs *flag.FlagSet) func() (string, *config.Config, error) {
	cfgPath := fs.String("config", "", "read audit.file.dir from this config `file`")
	dir := fs.String("dir", "", "audit log `folder` (instead of --config)")
	return func() (string, *config.Config, error) {
		switch {
		case *dir != "" && *cfgPath != "":
			return "", nil, usagef("give --config or --dir, not both")
		case *dir != "":
			return *dir, nil, nil
		case *cfgPath != "":
			c, err := config.Load(*cfgPath)
			if err != nil {
				return "", nil, err
			}
			return c.Audit.File.Dir, c, nil
		}
		return "", nil, usagef("give the audit log with --config FILE or --dir DIR")
	}
}

func runAuditQuery(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "audit query", "audit query [--config FILE | --dir DIR | --redis ADDR] [filters] [-o table|json]")
	resolveDir := auditDirFlags(fs)
	queryRedis := auditRedisFlags(fs)
	var f audit.Filter
	fs.StringVar(&f.Namespace, "namespace", "", "only this sandbox namespace")
	fs.StringVar(&f.Sandbox, "sandbox", "", "only this sandbox: `NAME` or NAMESPACE/NAME")
	fs.StringVar(&f.Template, "template", "", "only sandboxes of this template")
	fs.StringVar(&f.Credential, "credential", "", "only calls that injected this credential (its `name`)")
	fs.StringVar(&f.Kind, "kind", "", "only this kind (mcp.tools_call …) or family (mcp, http)")
	decision := choiceFlag(fs, "decision", "", "only calls with this `decision`: allow, deny, or report (denials a report-only template let through)", "allow", "deny", "report")
	fs.StringVar(&f.Tool, "tool", "", "only this MCP tool")
	fs.StringVar(&f.Host, "host", "", "only this HTTP host")
	since := fs.String("since", "", "from this RFC 3339 `time`, or this long ago (1h)")
	until := fs.String("until", "", "before this RFC 3339 `time`, or this long ago")
	fs.IntVar(&f.Limit, "limit", audit.DefaultLimit, "show the newest `N` matches (-1: all)")
	output := choiceFlag(fs, "o", "table", "output `format`: table or json (one event per line)", "table", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	f.Decision = *decision
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
	if err := f.Validate(); err != nil {
		return usagef("%v", err)
	}
	res, err := queryRedis(ctx, f)
	if errors.Is(err, errNoRedis) {
		var dir string
		if dir, _, err = resolveDir(); err != nil {
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
	if len(res.Events) == 0 {
		// Said on stderr, so that a script reading stdout sees an empty result either way.
		fmt.Fprintln(env.stderr, "no events match")
	}
	if res.Malformed > 0 {
		fmt.Fprintf(env.stderr, "warning: skipped %s; run 'sandgate audit verify' to locate them\n", plural(res.Malformed, "malformed line"))
	}
	return nil
}

func runAuditVerify(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "audit verify", "audit verify [--config FILE | --dir DIR] [--key-file FILE] [--public-key FILE] [--checkpoint FILE|-] [-o text|json]")
	resolveDir := auditDirFlags(fs)
	keyFile := fs.String("key-file", "", "chain key `file` (default with --config: audit.chain_key_credential)")
	publicKey := fs.String("public-key", "", "check checkpoint signatures with this Ed25519 public key `file` (PEM) "+
		"(default with --config: the key of audit.checkpoint.signing_key_credential)")
	checkpoints := fs.String("checkpoint", "", "checkpoints kept outside the log, one JSON line each, from this `file` or - for stdin: "+
		"the log must reach them (finds a cut-off or replaced log)")
	output := choiceFlag(fs, "o", "text", "output `format`: text, or json (one object: the findings and the exit code; for CI)", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	dir, cfg, err := resolveDir()
	if err != nil {
		return err
	}
	var opts audit.VerifyOptions
	if opts.ChainKey, err = verifyChainKey(env, cfg, *keyFile); err != nil {
		return err
	}
	if opts.PublicKey, err = verifyPublicKey(env, cfg, *publicKey); err != nil {
		return err
	}
	if *checkpoints != "" {
		if opts.External, err = readCheckpoints(env, *checkpoints); err != nil {
			return err
		}
	}
	report, err := audit.VerifyWith(dir, opts)
	if err != nil {
		return err
	}
	if *output == "json" {
		return writeVerifyJSON(env.stdout, dir, report)
	}
	switch {
	case !report.OK():
		return exitError{code: exitBroken, msg: report.String()}
	case !report.Complete():
		return exitError{code: exitUnprotected, msg: report.String()}
	}
	fmt.Fprintln(env.stdout, report)
	return nil
}

// verifyChainKey reads the chain key from --key-file, else from the config's credential.
func verifyChainKey(env *cliEnv, cfg *config.Config, keyFile string) ([]byte, error) {
	if keyFile != "" {
		key, err := audit.ReadKeyFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		return key, nil
	}
	if cfg == nil || cfg.Audit.ChainKeyCredential == "" {
		return nil, nil
	}
	v, err := configCredential(env, cfg, cfg.Audit.ChainKeyCredential)
	if err != nil {
		return nil, fmt.Errorf("audit.chain_key_credential: %w (or give --key-file)", err)
	}
	return []byte(v), nil
}

// verifyPublicKey reads --public-key, else derives the public key from the config's signing key.
func verifyPublicKey(env *cliEnv, cfg *config.Config, path string) (ed25519.PublicKey, error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--public-key: %w", err)
		}
		pub, err := audit.ParsePublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("--public-key %s: %w", path, err)
		}
		return pub, nil
	}
	if cfg == nil || cfg.Audit.Checkpoint.SigningKeyCredential == "" {
		return nil, nil
	}
	v, err := configCredential(env, cfg, cfg.Audit.Checkpoint.SigningKeyCredential)
	if err == nil {
		var key ed25519.PrivateKey
		if key, err = audit.ParseSigningKey([]byte(v)); err == nil {
			return key.Public().(ed25519.PublicKey), nil
		}
	}
	return nil, fmt.Errorf("audit.checkpoint.signing_key_credential: %w (or give --public-key)", err)
}

// configCredential reads one credential of the config, leaving the others alone: an auditor's
// machine need not have every secret the gateway has.
func configCredential(env *cliEnv, cfg *config.Config, name string) (string, error) {
	for _, c := range cfg.Credentials {
		if c.Name == name {
			store, err := credential.NewStore([]config.Credential{c}, env.getenv, nil)
			if err != nil {
				return "", err
			}
			v, _ := store.Get(name)
			return v, nil
		}
	}
	return "", fmt.Errorf("no credential named %q", name)
}

// readCheckpoints reads external checkpoints from a file or, for "-", from stdin.
func readCheckpoints(env *cliEnv, path string) ([]audit.Checkpoint, error) {
	var r io.Reader
	if path == "-" {
		if env.stdin == nil {
			return nil, fmt.Errorf("%w: --checkpoint -: no standard input", errUsage)
		}
		r = env.stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--checkpoint: %w", err)
		}
		defer f.Close()
		r = f
	}
	cps, err := audit.ParseCheckpoints(r)
	if err != nil {
		return nil, fmt.Errorf("--checkpoint %s: %w", path, err)
	}
	return cps, nil
}

func runAuditKeygen(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "audit keygen", "audit keygen --dir DIR [--force]")
	dir := fs.String("dir", "", "`folder` for checkpoint.key, checkpoint.pub and chain.key (created with mode 0700)")
	force := fs.Bool("force", false, "replace existing keys (logs written with the old ones need the old ones to verify)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("%w: --dir is required", errUsage)
	}
	paths, err := audit.GenerateKeys(*dir, *force)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "wrote %s (mode 0600: audit.checkpoint.signing_key_credential)\n", paths[0])
	fmt.Fprintf(env.stdout, "wrote %s (give it to auditors: audit verify --public-key)\n", paths[1])
	fmt.Fprintf(env.stdout, "wrote %s (mode 0600: audit.chain_key_credential; auditors: audit verify --key-file)\n", paths[2])
	return nil
}

// errNoRedis is auditRedisFlags' answer when --redis was not given.
var errNoRedis = errors.New("no --redis")

// auditRedisFlags registers --redis, --redis-cluster, --redis-stream, --redis-db,
// --redis-username, --redis-password-file and --redis-tls-*, and returns a query of the audit
// streams of all replicas (errNoRedis without --redis).
func auditRedisFlags(fs *flag.FlagSet) func(context.Context, audit.Filter) (*audit.QueryResult, error) {
	addr := fs.String("redis", "", "query the audit streams of all replicas at `host:port` instead of a folder (with --redis-cluster: seed nodes, comma-separated)")
	cluster := fs.Bool("redis-cluster", false, "--redis names Redis Cluster seed nodes")
	stream := fs.String("redis-stream", "sandgate:audit", "the audit streams' base `name` (redis.audit_stream.name)")
	db := fs.Int("redis-db", 0, "Redis database `number`")
	user := fs.String("redis-username", "", "Redis ACL `user`")
	passwordFile := fs.String("redis-password-file", "", "read the Redis password from this `file`")
	caFile := fs.String("redis-tls-ca-file", "", "connect with TLS, verifying the server against this CA `file`")
	serverName := fs.String("redis-tls-server-name", "", "with TLS, the `name` the server's certificate must carry")
	return func(ctx context.Context, f audit.Filter) (*audit.QueryResult, error) {
		if *addr == "" {
			return nil, errNoRedis
		}
		rc := config.Redis{Addr: *addr, DB: *db, Username: *user,
			DialTimeout: config.Duration(5 * time.Second), OpTimeout: config.Duration(30 * time.Second)}
		if *cluster {
			rc.Addr, rc.Cluster = "", &config.RedisCluster{Addrs: strings.Split(*addr, ",")}
		}
		if *caFile != "" || *serverName != "" {
			rc.TLS = &config.RedisTLS{CAFile: *caFile, ServerName: *serverName}
		}
		var pw redisconn.Passwords
		if *passwordFile != "" {
			b, err := os.ReadFile(*passwordFile)
			if err != nil {
				return nil, fmt.Errorf("--redis-password-file: %w", err)
			}
			pw.Redis = strings.TrimSpace(string(b))
		}
		client, err := redisconn.New(rc, pw)
		if err != nil {
			return nil, err
		}
		defer client.Close()
		return audit.QueryRedis(ctx, client, *stream, f)
	}
}
