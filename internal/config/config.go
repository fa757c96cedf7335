package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/internal/identity"
)

// Config is the whole configuration file.
type Config struct {
	Listen      Listen       `json:"listen"`
	Admin       Admin        `json:"admin"`
	Policy      Policy       `json:"policy"`
	Audit       Audit        `json:"audit"`
	Identity    Identity     `json:"identity"`
	Credentials []Credential `json:"credentials"`
	// RunTokens configures the JWTs Sandgate signs for sandbox runs (token_exchange).
	RunTokens  *RunTokens `json:"run_tokens"`
	Gateway    Gateway    `json:"gateway"`
	Proxy      Proxy      `json:"proxy"`
	Kubernetes Kubernetes `json:"kubernetes"`
	Redis      Redis      `json:"redis"`
	Limits     Limits     `json:"limits"`
	Shutdown   Shutdown   `json:"shutdown"`
	Log        Log        `json:"log"`

	// Dir is the folder of the config file; relative paths in it are resolved against Dir.
	Dir string `json:"-"`
}

// Listen holds the three listener addresses. An empty address disables that listener.
type Listen struct {
	MCP   string `json:"mcp"`
	Proxy string `json:"proxy"`
	Admin string `json:"admin"`
	// MaxConnsPerSource caps the connections one source address (one sandbox) holds open to
	// the MCP and the proxy listener each (default 512); one over it is closed and audited.
	MaxConnsPerSource int `json:"max_conns_per_source"`
}

// Admin configures the admin listener's API (grants). Metrics and health need no token.
type Admin struct {
	// TokenCredential names the credential whose value callers of the admin API must present as a
	// bearer token. Empty disables the admin API (health and metrics stay).
	TokenCredential string `json:"token_credential"`
	// Pprof serves Go's profiler under /debug/pprof/ on the admin listener (default off; for
	// benchmarks and incidents).
	Pprof bool `json:"pprof"`
}

// Policy configures the Rego engine.
type Policy struct {
	// Dir holds *.rego files and optional data files (*.json, *.yaml); *_test.rego are skipped.
	Dir string `json:"dir"`
	// Watch reloads the policies when a file in Dir changes. Default true.
	Watch *bool `json:"watch"`
	// PollInterval is how often the watch also hashes Dir's contents and reloads when they
	// changed, the backstop for a change the file watcher missed. Default 10s.
	PollInterval Duration `json:"poll_interval"`
	// DecisionCache bounds the decisions remembered per policy revision, keyed by the parts
	// of input the policies read (docs/policies.md). Default 16384; 0 turns it off.
	DecisionCache *int `json:"decision_cache"`
	// DecisionLog writes every call's decision, with its full input, in OPA's decision-log
	// format (docs/policies.md). Off unless file is set.
	DecisionLog DecisionLog `json:"decision_log"`
	// Shadow evaluates a candidate policy beside this one, off the request path.
	Shadow Shadow `json:"shadow"`
	// Bundle loads the policies from a signed OPA bundle instead of Dir.
	Bundle Bundle `json:"bundle"`
}

// DecisionLog configures the policy decision log, read by `sandgate policy replay` and
// `policy eval --decision-id`.
type DecisionLog struct {
	// File is the active log file; rotated files sit next to it. Empty (and no http.url):
	// no decision log.
	File string `json:"file"`
	// HTTP uploads the events to a decision-log service as OPA's plugin does.
	HTTP DecisionLogHTTP `json:"http"`
	// MaxSizeMB rotates the file when it would grow past this size. Default 64.
	MaxSizeMB int `json:"max_size_mb"`
	// MaxFiles is how many rotated files are kept. Default 10.
	MaxFiles int `json:"max_files"`
	// Mask lists JSON pointers into the logged event ("/input/mcp/arguments/token") whose
	// values are replaced by "**masked**"; a last segment "*" masks every member. Unset: every
	// tool-call argument value is masked; an empty list masks nothing.
	Mask []string `json:"mask"`
}

// DefaultDecisionCache is policy.decision_cache when the file does not set it.
const DefaultDecisionCache = 16384

// DecisionCacheEntries is policy.decision_cache with its default applied.
func (p Policy) DecisionCacheEntries() int {
	if p.DecisionCache == nil {
		return DefaultDecisionCache
	}
	return *p.DecisionCache
}

// WatchEnabled reports whether policy hot reload is on.
func (p Policy) WatchEnabled() bool { return p.Watch == nil || *p.Watch }

// Audit configures the audit log.
type Audit struct {
	File AuditFile `json:"file"`
	// Delivery is "blocking" (default: a call's answer, for a stream its final bytes, is
	// released only once its event is written to the file, so killing the process loses no
	// answered call's event) or "async" (the answer does not wait; a crash loses the events of
	// the last few milliseconds' calls). docs/audit.md, "Delivery".
	Delivery string `json:"delivery"`
	// ChainKeyCredential names the credential whose value keys the hash chain: each line's hash
	// is then an HMAC-SHA-256 under it, which someone who can write the files cannot recompute
	// (docs/audit.md). At least 32 bytes. Empty: plain SHA-256.
	ChainKeyCredential string `json:"chain_key_credential"`
	// Checkpoint adds signed checkpoints to the log (off unless signing_key_credential is set).
	Checkpoint AuditCheckpoint `json:"checkpoint"`
	// OTLP ships the log to an OpenTelemetry Collector (off unless enabled or an endpoint is set).
	OTLP AuditOTLP `json:"otlp"`
}

// Audit delivery modes (Audit.Delivery).
const (
	AuditBlocking = "blocking"
	AuditAsync    = "async"
)

// AuditCheckpoint configures signed checkpoints: statements of the log's line count and head
// hash, signed with Ed25519, written into the log and into Sandgate's own log.
type AuditCheckpoint struct {
	// SigningKeyCredential names the credential holding the Ed25519 private key, PEM PKCS #8
	// ("sandgate audit keygen" writes one).
	SigningKeyCredential string `json:"signing_key_credential"`
	// EveryEvents writes a checkpoint after this many events. Default 1000.
	EveryEvents int `json:"every_events"`
	// Every writes a checkpoint this often when events were written since the last one. Default 1m.
	Every Duration `json:"every"`
}

// AuditFile is the JSON-lines file sink.
type AuditFile struct {
	// Dir receives audit.log and its rotated predecessors.
	Dir string `json:"dir"`
	// MaxSizeMB rotates the active file when it would grow past this size. Default 64.
	MaxSizeMB int `json:"max_size_mb"`
	// Fsync is "batch" (default: fsync at most every FsyncInterval), "always" (before each batch is
	// acknowledged) or "never" (leave it to the OS).
	Fsync string `json:"fsync"`
	// FsyncInterval bounds how long an acknowledged event may sit unsynced in batch mode.
	FsyncInterval Duration `json:"fsync_interval"`
	// ReserveMB is disk space kept aside in the audit dir so that the events of admitted calls
	// are written when the disk fills up (docs/audit.md, "When the disk fills up"). Default 32.
	ReserveMB int `json:"reserve_mb"`
}

// Identity says how callers are identified.
type Identity struct {
	// Static is the embedded default: sandboxes listed by address.
	Static []identity.StaticEntry `json:"static"`
}

// Redis connects replicas to shared state. Exactly one topology is set (Addr, Sentinel or
// Cluster); none keeps everything in memory.
type Redis struct {
	// Addr is a single Redis server, host:port.
	Addr string `json:"addr"`
	// Sentinel finds the primary through Redis Sentinel and follows its failovers.
	Sentinel *RedisSentinel `json:"sentinel"`
	// Cluster is a Redis Cluster, found from any of its seed addresses.
	Cluster *RedisCluster `json:"cluster"`
	// Username is the ACL user (Redis 6+); empty is the default user.
	Username string `json:"username"`
	// PasswordCredential names a credential holding the Redis password.
	PasswordCredential string `json:"password_credential"`
	// TLS, when set, connects with TLS and verifies the server against CAFile.
	TLS *RedisTLS `json:"tls"`
	DB  int       `json:"db"`
	// KeyPrefix starts every key Sandgate writes, so that several deployments can share one Redis.
	// Default "sandgate:".
	KeyPrefix string `json:"key_prefix"`
	// OpTimeout bounds every Redis call on the request path in total, connecting and waiting for
	// a pooled connection included (default 250ms), so a Redis outage delays a request by at most
	// about this much. DialTimeout bounds one connection attempt of background work (readiness,
	// the audit stream mirror; default 1s); on the request path op_timeout cuts it shorter.
	DialTimeout Duration `json:"dial_timeout"`
	OpTimeout   Duration `json:"op_timeout"`
	// Breaker skips Redis on the request path for a while after it failed, so that an outage
	// costs a call nothing instead of op_timeout.
	Breaker RedisBreaker `json:"breaker"`
	// AuditStream mirrors the audit log into a Redis Stream (the file stays the source of truth).
	AuditStream RedisAuditStream `json:"audit_stream"`
}

// Log configures Sandgate's own log (not the audit log).
type Log struct {
	Level  string `json:"level"`  // debug, info (default), warn, error
	Format string `json:"format"` // json (default) or text
}

// Duration is a time.Duration written as "250ms", "5s" or "1m" in YAML.
type Duration time.Duration

// UnmarshalJSON accepts a Go duration string; null leaves the duration unset (its default).
// A bad value is a *json.UnmarshalTypeError whose Value is the JSON literal as written: the
// decoder fills in the field's path only on that type, and decodeError says what is wrong
// with the literal (parseDuration) under that path.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := parseDuration(b)
	if err != nil {
		return &json.UnmarshalTypeError{Value: string(b), Type: reflect.TypeFor[Duration]()}
	}
	*d = v
	return nil
}

// parseDuration reads a JSON string such as "500ms" or "5s"; a number, a negative duration or
// a string that does not parse is an error that says so.
func parseDuration(b []byte) (Duration, error) {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, fmt.Errorf("want a duration with a unit such as \"500ms\" or \"5s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as \"500ms\" or \"5s\", got %q", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("duration %q is negative", s)
	}
	return Duration(v), nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Load reads, decodes and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(b, dir)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a config document. Relative paths are resolved against dir.
func Parse(doc []byte, dir string) (*Config, error) {
	c := &Config{}
	if len(bytes.TrimSpace(doc)) > 0 {
		var generic any
		if err := yaml.Unmarshal(doc, &generic); err != nil {
			return nil, decodeError(err, nil)
		}
		if errs := unknownFields(generic); len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		if err := yaml.UnmarshalStrict(doc, c); err != nil {
			return nil, decodeError(err, generic)
		}
	}
	c.Dir = dir
	c.applyDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeError says which field the decoder refused and why. A value of the wrong type (and a
// duration that does not parse) is a *json.UnmarshalTypeError carrying the field's path;
// generic, the document as decoded without types, supplies the list positions that path lacks.
func decodeError(err error, generic any) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		field := fieldPath(generic, te)
		if te.Type == reflect.TypeFor[Duration]() {
			if _, perr := parseDuration([]byte(te.Value)); perr != nil {
				return fmt.Errorf("%s: %w", field, perr)
			}
		}
		return fmt.Errorf("%s: want %s, got %s", field, te.Type, te.Value)
	}
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: while decoding JSON: ")
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	return fmt.Errorf("decode: %s", msg)
}

// fieldPath is te's field as a YAML path. The decoder names struct fields but not list
// positions ("gateway.upstreams.connect_timeout"); the position is that of the first value
// along the path in generic that does not decode into te.Type, the one the decoder stopped at
// ("gateway.upstreams[1].connect_timeout").
func fieldPath(generic any, te *json.UnmarshalTypeError) string {
	refused := func(v any) bool {
		b, err := json.Marshal(v)
		return err == nil && json.Unmarshal(b, reflect.New(te.Type).Interface()) != nil
	}
	if p, ok := findPath(generic, strings.Split(te.Field, "."), "", refused); ok {
		return p
	}
	return te.Field
}

func findPath(doc any, fields []string, path string, refused func(any) bool) (string, bool) {
	if len(fields) == 0 {
		return path, refused(doc)
	}
	switch v := doc.(type) {
	case []any:
		for i, e := range v {
			if p, ok := findPath(e, fields, fmt.Sprintf("%s[%d]", path, i), refused); ok {
				return p, true
			}
		}
	case map[string]any:
		if e, ok := v[fields[0]]; ok {
			return findPath(e, fields[1:], join(path, fields[0]), refused)
		}
		if unicode.IsUpper([]rune(fields[0])[0]) {
			// An inline struct's Go name (TemplateLimits.LimitSet): keys are lowercase.
			return findPath(v, fields[1:], path, refused)
		}
		// A map (limits.templates): the decoder's path has no key for its entries.
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if p, ok := findPath(v[k], fields, join(path, k), refused); ok {
				return p, true
			}
		}
	}
	return "", false
}

func (c *Config) applyDefaults() {
	if c.Listen.MaxConnsPerSource == 0 {
		c.Listen.MaxConnsPerSource = 512
	}
	c.Policy.applyDefaults(c)
	if c.Audit.File.Dir == "" {
		c.Audit.File.Dir = "var/audit"
	}
	if c.Audit.Delivery == "" {
		c.Audit.Delivery = AuditBlocking
	}
	if c.Audit.File.ReserveMB == 0 {
		c.Audit.File.ReserveMB = 32
	}
	if c.Audit.File.MaxSizeMB == 0 {
		c.Audit.File.MaxSizeMB = 64
	}
	if c.Audit.File.Fsync == "" {
		c.Audit.File.Fsync = "batch"
	}
	if c.Audit.File.FsyncInterval == 0 {
		c.Audit.File.FsyncInterval = Duration(100 * time.Millisecond)
	}
	if c.Audit.Checkpoint.EveryEvents == 0 {
		c.Audit.Checkpoint.EveryEvents = 1000
	}
	if c.Audit.Checkpoint.Every == 0 {
		c.Audit.Checkpoint.Every = Duration(time.Minute)
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "json"
	}
	c.Audit.File.Dir = c.Path(c.Audit.File.Dir)
	c.Audit.OTLP.applyDefaults(c)
	for i := range c.Credentials {
		c.Credentials[i].applyDefaults(c)
	}
	if c.RunTokens != nil {
		c.RunTokens.applyDefaults()
	}
	c.Gateway.applyDefaults(c)
	c.Proxy.applyDefaults(c)
	c.Kubernetes.applyDefaults(c)
	c.Redis.applyDefaults(c)
	c.Limits.applyDefaults()
}

// Path resolves p against the config file's folder unless it is absolute.
func (c *Config) Path(p string) string {
	if p == "" || filepath.IsAbs(p) || c.Dir == "" {
		return p
	}
	return filepath.Join(c.Dir, p)
}

// fieldErrors collects validation errors so that one run reports every mistake.
type fieldErrors []error

func (f *fieldErrors) add(field, format string, args ...any) {
	*f = append(*f, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

func (f fieldErrors) err() error { return errors.Join(f...) }

// unique records that list[i] is named name and reports a name an earlier entry already has.
func (f *fieldErrors) unique(seen map[string]int, list string, i int, name string) {
	if j, dup := seen[name]; dup && name != "" {
		f.add(fmt.Sprintf("%s[%d].name", list, i), "%q is already defined by %s[%d]", name, list, j)
	}
	seen[name] = i
}

func (l Listen) validate(errs *fieldErrors) {
	for _, a := range []struct{ field, addr string }{
		{"listen.mcp", l.MCP}, {"listen.proxy", l.Proxy}, {"listen.admin", l.Admin},
	} {
		if a.addr != "" {
			validateHostPort(errs, a.field, a.addr, "127.0.0.1:8080 or :8080")
		}
	}
	listenersOverlap(errs, l)
	if l.MaxConnsPerSource < 0 {
		errs.add("listen.max_conns_per_source", "must not be negative, got %d", l.MaxConnsPerSource)
	}
}

func (c *Config) validate() error {
	var errs fieldErrors
	c.Listen.validate(&errs)
	switch c.Audit.File.Fsync {
	case "batch", "always", "never":
	default:
		errs.add("audit.file.fsync", "%q is not one of batch, always, never", c.Audit.File.Fsync)
	}
	switch c.Audit.Delivery {
	case AuditBlocking, AuditAsync:
	default:
		errs.add("audit.delivery", "%q is not one of blocking, async", c.Audit.Delivery)
	}
	c.Policy.validate(&errs)
	if c.Audit.File.MaxSizeMB < 0 {
		errs.add("audit.file.max_size_mb", "must be positive, got %d", c.Audit.File.MaxSizeMB)
	}
	if c.Audit.File.ReserveMB < 0 {
		errs.add("audit.file.reserve_mb", "must be positive, got %d", c.Audit.File.ReserveMB)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs.add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "text":
	default:
		errs.add("log.format", "%q is not one of json, text", c.Log.Format)
	}
	c.validateCredentials(&errs)
	names := map[string]int{}
	for i, cr := range c.Credentials {
		names[cr.Name] = i
	}
	if _, err := identity.NewStatic(c.Identity.Static); err != nil {
		errs = append(errs, errors.New(strings.ReplaceAll(err.Error(), "sandboxes[", "identity.static[")))
	}
	if c.Admin.TokenCredential != "" {
		if _, ok := names[c.Admin.TokenCredential]; !ok {
			errs.add("admin.token_credential", "no credential named %q in credentials", c.Admin.TokenCredential)
		}
	}
	for field, name := range map[string]string{
		"audit.chain_key_credential":              c.Audit.ChainKeyCredential,
		"audit.checkpoint.signing_key_credential": c.Audit.Checkpoint.SigningKeyCredential,
	} {
		if _, ok := names[name]; name != "" && !ok {
			errs.add(field, "no credential named %q in credentials", name)
		}
	}
	if c.Audit.Checkpoint.EveryEvents < 0 {
		errs.add("audit.checkpoint.every_events", "must be a positive number of events, got %d", c.Audit.Checkpoint.EveryEvents)
	}
	c.Audit.OTLP.validate(c, &errs)
	c.Gateway.validate(c, &errs)
	c.Proxy.validate(c, &errs)
	c.Kubernetes.validate(c, &errs)
	c.Redis.validate(c, &errs)
	c.Limits.validate(&errs)
	c.Shutdown.validate(&errs)
	return errs.err()
}

// HasCredential reports whether a credential of that name is defined.
func (c *Config) HasCredential(name string) bool {
	for _, cr := range c.Credentials {
		if cr.Name == name {
			return true
		}
	}
	return false
}

func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return s != ""
}

func (d DecisionLog) validate(errs *fieldErrors) {
	if d.MaxSizeMB < 0 {
		errs.add("policy.decision_log.max_size_mb", "must be positive, got %d", d.MaxSizeMB)
	}
	if d.MaxFiles < 0 {
		errs.add("policy.decision_log.max_files", "must be positive, got %d", d.MaxFiles)
	}
	for i, p := range d.Mask {
		// The grammar is policy.CheckMask's (which this package cannot import); serve checks again.
		parts := strings.Split(p, "/")
		if len(parts) < 3 || parts[0] != "" || (parts[1] != "input" && parts[1] != "result") || parts[2] == "" {
			errs.add(fmt.Sprintf("policy.decision_log.mask[%d]", i), "%q is not a JSON pointer below /input/ or /result/, e.g. /input/mcp/arguments/token", p)
		}
	}
}
