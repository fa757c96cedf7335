package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/gcfloor"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/internal/telemetry"
	"github.com/sandgate/sandgate/policy"
)

// serveDeps is what every listener component is built from: the one request path of
// ARCHITECTURE.md (identity → policy → audit) plus credentials, metrics and readiness.
type serveDeps struct {
	cfg      *config.Config
	log      *slog.Logger
	identity identity.Resolver
	policy   *policy.Engine
	audit    audit.Recorder
	creds    *credential.Store
	meters   metric.MeterProvider
	ready    *readiness
	// limits and grants are the shared state (Redis, or memory without redis.addr); admission is
	// the one view of them the gateway and the proxy use on the request path.
	limits    *limits.Limiter
	grants    grants.Store
	admission *admission.Admission
	sessions  mcpsessions.Store // nil: MCP sessions stay on their replica
	// catalogs keeps the upstreams' last known catalogs: in Redis, else beside the audit log.
	catalogs gateway.CatalogStore
	tracer   trace.TracerProvider
	// core is the one request path both halves call (internal/call).
	core *call.Core
	// bound are the listeners serve bound at its start, by name (mcp, proxy, admin), at started.
	bound   map[string]net.Listener
	started time.Time
	// policyLoops keep the policies current (watches, bundle polling) and run the shadow.
	policyLoops []component
}

// component is one listener (admin, MCP, proxy) or background loop. Serve runs until ctx ends,
// then shuts down gracefully and returns nil; an error return stops the whole process.
type component interface {
	Serve(ctx context.Context) error
}

type componentFunc func(ctx context.Context) error

func (f componentFunc) Serve(ctx context.Context) error { return f(ctx) }

// adminGrace bounds how long the admin listener's requests may take once the sandbox listeners
// have drained (serve_shutdown.go); the audit log is flushed after them, within its own bound.
const (
	adminGrace       = time.Second
	auditFlushBound  = 10 * time.Second
	credentialPoll   = 5 * time.Second
	defaultConfigRel = "examples/sandgate.yaml"
)

// errNoServeConfig is serve's refusal to start without a config named: a production binary does
// not fall back to the demo file of whatever folder it was started in.
var errNoServeConfig = usagef("no config: pass --config FILE (or set $SANDGATE_CONFIG); " +
	"examples/sandgate.yaml is the local example, which `make run` serves")

func runServe(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "serve", "serve --config FILE [--check-config [--offline] [-o text|json]]")
	cfgPath := fs.String("config", "", "config `file` (default $SANDGATE_CONFIG; one of the two is required)")
	check := fs.Bool("check-config", false, "validate the config and the files it names, read the credentials and audit keys, load the CA, compile the policies, then exit")
	offline := fs.Bool("offline", false, "with --check-config: a config rendered for a pod, checked elsewhere; skip the credentials, CA and policy folder only the pod has")
	output := choiceFlag(fs, "o", "text", "with --check-config: output `format`, text or json (one object: valid, the error, the exit code; for CI)", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *offline && !*check {
		return usagef("--offline applies to --check-config only")
	}
	if *output != "text" && !*check {
		return usagef("-o applies to --check-config only (serve logs as log.format says)")
	}
	path := *cfgPath
	if path == "" {
		path = env.getenv("SANDGATE_CONFIG")
	}
	if path == "" {
		return errNoServeConfig
	}
	cfg, err := config.Load(path)
	if *check {
		if err == nil {
			err = checkConfig(ctx, env, path, cfg, *offline)
		}
		return reportCheck(env, path, *offline, *output, err)
	}
	if err != nil {
		return err
	}
	log := newLogger(env, cfg.Log)
	creds, err := credential.NewStore(cfg.Credentials, env.getenv, log)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	memLimit, err := memoryLimitFromEnv(env.getenv)
	if err != nil {
		return err
	}
	if memLimit > 0 {
		debug.SetMemoryLimit(memLimit)
		log.Info("go memory limit set to 90% of the container's", "soft_limit_bytes", memLimit, "from", containerMemoryEnv)
	}
	floor, err := heapFloorFromEnv(env.getenv, debug.SetMemoryLimit(-1))
	if err != nil {
		return err
	}
	if floor > 0 { // GOGC is unset, so the runtime's own 100 is the base
		defer gcfloor.Start(floor, 100).Stop()
		log.Debug("go heap floor set", "floor_bytes", floor, "from", heapFloorEnv)
	}
	// go-redis logs through a package-level logger; this is the one place it is set.
	redis.SetLogger(redisLogger{log.With("component", "redis"), telemetry.NewThrottle(warnPeriod, nil)})
	return serve(ctx, cfg, creds, log, env.getenv, env.now)
}

// serve builds the request path and runs every component until ctx ends. getenv gives
// $SANDGATE_REPLICA (else $POD_NAME, else the host name), which names this process in the shared
// audit stream, and the OTEL_* variables that decide whether spans are exported.
func serve(ctx context.Context, cfg *config.Config, creds *credential.Store, log *slog.Logger, getenv func(string) string, now func() time.Time) error {
	started := time.Now()
	bound, err := bindListeners(cfg.Listen)
	if err != nil {
		return err
	}
	defer closeListeners(bound) // those no component took, when serve fails before running them
	replica := replicaName(getenv)
	tel, err := telemetry.New(telemetry.WithGetenv(getenv))
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	// Not ready from the moment shutdown begins, so a Service stops sending while calls drain.
	ready, shutdown := &readiness{}, &shutdownState{}
	ready.Add("shutdown", shutdown.check)
	ps, err := newPolicySide(ctx, cfg, log, tel, ready)
	if err != nil {
		return err
	}
	shared, err := newSharedState(cfg, creds, replica, log, tel.MeterProvider(), ready, now)
	if err != nil {
		return err
	}
	defer shared.close()
	writerOpts, err := auditWriterOptions(cfg, creds, log)
	if err != nil {
		return err
	}
	sink, err := openAuditSink(cfg, log)
	if err != nil {
		return err
	}
	warnRecovered(sink, log)
	// The sink holds the audit folder (its lock) until it is closed: by finishAudit once serving
	// began, here when serve gives up before.
	serving := false
	defer closeUnless(&serving, sink)
	export, err := newAuditExport(cfg, creds, replica, shared.mirror, log, getenv, tel.MeterProvider(), ready)
	if err != nil {
		return err
	}
	defer export.close()
	writer := audit.NewWriter(export.wrapSink(sink), writerOpts...)
	ready.Add("audit", writer.Healthy)
	if err := errors.Join(observeAudit(tel.MeterProvider(), writer), observeReadiness(tel.MeterProvider(), ready)); err != nil {
		return err
	}
	resolver, kubeComps, err := newResolver(cfg, log, tel, ready, runGone(creds, shared.sandboxGone(log)))
	if err != nil {
		return err
	}
	d := &serveDeps{cfg: cfg, log: log, identity: resolver, policy: ps.engine, audit: writer, bound: bound, started: started,
		creds: creds, meters: tel.MeterProvider(), ready: ready, limits: shared.limits, grants: shared.grants, sessions: shared.sessions, tracer: tel.TracerProvider(),
		catalogs: shared.catalogs(cfg)}
	if d.admission, err = shared.admission(d); err != nil {
		return err
	}
	closeDecisions, err := newCore(d, ps, writer, replica, tel)
	if err != nil {
		return err
	}
	defer closeDecisions()
	mintComps, err := mintedCredentials(d, shared)
	if err != nil {
		return err
	}
	listeners, background, err := serveComponents(d, creds, shared, tel, slices.Concat(kubeComps, mintComps, export.components()))
	if err != nil {
		return err
	}

	serving = true
	log.Info("sandgate starting", "version", version, "policy_revision", ps.engine.Revision(),
		"mcp", cfg.Listen.MCP, "proxy", cfg.Listen.Proxy, "admin", cfg.Listen.Admin)
	runErr := errors.Join(runComponents(ctx, cfg.Shutdown, shutdown, d.core, listeners, background),
		finishAudit(d, writer, shared, export))
	log.Info("sandgate stopped")
	return runErr
}

// finishAudit runs once the listeners have drained: every call they accepted has recorded its
// event, and the counts of suppressed rejection events are written now. It flushes the log,
// then sends its tail to the Redis stream and the OTLP Collector side by side, all within
// auditFlushBound.
func finishAudit(d *serveDeps, writer *audit.Writer, shared *sharedState, export *auditExport) error {
	d.core.FlushRejections(context.Background(), true)
	flushCtx, cancel := context.WithTimeout(context.Background(), auditFlushBound)
	defer cancel()
	var err error
	if cerr := writer.Close(flushCtx); cerr != nil {
		d.log.Error("audit flush on shutdown failed", "err", cerr)
		err = fmt.Errorf("flush audit log: %w", cerr)
	}
	syncAll(func() { shared.sync(flushCtx, d.log) }, func() { export.sync(flushCtx) })
	return err
}

// newCore builds the request path into d.core, with the decision log when one is configured.
// The returned function closes the decision log; serve calls it once the listeners have
// drained, when every decision they made is queued.
func newCore(d *serveDeps, ps *policySide, writer *audit.Writer, replica string, tel *telemetry.Telemetry) (func(), error) {
	opts := call.Options{Policy: ps.engine, Audit: writer, Admission: d.admission, Credentials: d.creds,
		Meters: d.meters, Tracer: d.tracer, Log: d.log.With("component", "call")}
	if hasMinted(d.cfg) {
		opts.Credentials = d.creds
	}
	decisions, err := openDecisionLog(d.cfg, replica, d.log, tel)
	if err != nil {
		return nil, err
	}
	closeDecisions := func() {}
	if decisions != nil {
		opts.Decisions = decisions
		closeDecisions = func() {
			if err := decisions.Close(); err != nil {
				d.log.Error("decision log close failed", "err", err)
			}
		}
	}
	d.policyLoops = ps.loops
	if ps.shadow != nil {
		shadow := policy.NewShadow(ps.shadow, policy.ShadowConfig{QueueSize: d.cfg.Policy.Shadow.QueueSize,
			Decisions: decisions, Meters: d.meters, Log: d.log.With("component", "shadow")})
		opts.Shadow = shadow
		d.policyLoops = append(d.policyLoops, componentFunc(shadow.Run))
	}
	d.core, err = call.New(opts)
	if err != nil {
		closeDecisions()
		return nil, err
	}
	return closeDecisions, nil
}

// serveComponents is everything serve runs: the sandbox listeners, and in the background the
// admin listener, the Kubernetes controllers and the audit exporter (extra), the shared state's
// loops and the policy and credential watchers, which keep serving until the listeners have
// drained, and the line that says when serve is ready.
func serveComponents(d *serveDeps, creds *credential.Store, shared *sharedState, tel *telemetry.Telemetry, extra []component) (listeners, background []component, _ error) {
	comps := append([]component{newAdminComponent(d, tel.Handler())}, extra...)
	comps = append(comps, shared.components()...)
	comps = append(comps, componentFunc(func(ctx context.Context) error { flushRejections(ctx, d.core); return nil }))
	comps = append(comps, d.policyLoops...)
	comps = append(comps, componentFunc(func(ctx context.Context) error { creds.Watch(ctx, credentialPoll); return nil }))
	comps = append(comps, announceReady(d.cfg.Listen, d.ready, d.log, d.started))
	for _, build := range listenerBuilders(d.cfg) {
		c, err := build(d)
		if err != nil {
			return nil, nil, err
		}
		listeners = append(listeners, c)
	}
	return listeners, comps, nil
}

// observeAudit exports the audit writer's queue depth: a queue near its capacity means the sink
// cannot keep up, and new calls are refused once it is full.
func observeAudit(mp metric.MeterProvider, w *audit.Writer) error {
	m := mp.Meter("github.com/sandgate/sandgate/audit")
	depth, err := m.Int64ObservableGauge("sandgate.audit.queue.depth", metric.WithDescription("Audit events accepted but not yet written"))
	if err != nil {
		return fmt.Errorf("audit metrics: %w", err)
	}
	capacity, err := m.Int64ObservableGauge("sandgate.audit.queue.capacity", metric.WithDescription("Audit events the queue holds at most"))
	if err != nil {
		return fmt.Errorf("audit metrics: %w", err)
	}
	owed, err := m.Int64ObservableGauge("sandgate.audit.reserve.owed", metric.WithUnit("By"),
		metric.WithDescription("Bytes of the audit reserve held by requests in flight and events not yet written (docs/audit.md)"))
	if err != nil {
		return fmt.Errorf("audit metrics: %w", err)
	}
	short, err := m.Int64ObservableGauge("sandgate.audit.reserve.short",
		metric.WithDescription("1 while the audit disk is full and the reserve is drawn on: new requests are refused"))
	if err != nil {
		return fmt.Errorf("audit metrics: %w", err)
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := w.Stats()
		o.ObserveInt64(depth, int64(s.QueueDepth))
		o.ObserveInt64(capacity, int64(s.QueueCapacity))
		o.ObserveInt64(owed, s.ReserveOwed)
		o.ObserveInt64(short, boolGauge(s.ReserveShort))
		return nil
	}, depth, capacity, owed, short)
	if err != nil {
		return fmt.Errorf("audit metrics: %w", err)
	}
	return nil
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// auditWriterOptions keys the chain and turns on signed checkpoints as audit.* says. The keys are
// read once, at start. Each checkpoint is also written to the process log, so that a log system
// outside the pod holds a copy that reveals an audit log cut off or replaced later
// (sandgate audit verify --checkpoint).
func auditWriterOptions(cfg *config.Config, creds *credential.Store, log *slog.Logger) ([]audit.Option, error) {
	delivery, err := audit.ParseDelivery(cfg.Audit.Delivery)
	if err != nil {
		return nil, err
	}
	opts := []audit.Option{audit.WithDelivery(delivery)}
	if name := cfg.Audit.ChainKeyCredential; name != "" {
		v, ok := creds.Get(name)
		if !ok {
			return nil, fmt.Errorf("audit.chain_key_credential: credential %q is not available", name)
		}
		if len(v) < audit.MinChainKeyLen {
			return nil, fmt.Errorf("audit.chain_key_credential: credential %q has %d bytes, want at least %d "+
				"(sandgate audit keygen writes one)", name, len(v), audit.MinChainKeyLen)
		}
		opts = append(opts, audit.WithChainKey([]byte(v)))
		log.Info("audit chain keyed", "alg", audit.ChainHMACSHA256, "key_id", audit.ChainKeyID([]byte(v)))
	}
	if cp := cfg.Audit.Checkpoint; cp.SigningKeyCredential != "" {
		v, ok := creds.Get(cp.SigningKeyCredential)
		if !ok {
			return nil, fmt.Errorf("audit.checkpoint.signing_key_credential: credential %q is not available", cp.SigningKeyCredential)
		}
		key, err := audit.ParseSigningKey([]byte(v))
		if err != nil {
			return nil, fmt.Errorf("audit.checkpoint.signing_key_credential: %w", err)
		}
		cpLog := log.With("component", "audit")
		opts = append(opts, audit.WithCheckpoints(audit.CheckpointConfig{
			Key: key, EveryEvents: cp.EveryEvents, Every: cp.Every.D(),
			Published: func(c audit.Checkpoint) { cpLog.Info("audit checkpoint", "checkpoint", c) },
		}))
		log.Info("audit checkpoints signed", "key_id", audit.PublicKeyID(key.Public().(ed25519.PublicKey)),
			"every_events", cp.EveryEvents, "every", cp.Every.D().String())
	}
	return opts, nil
}

// openAuditSink opens the audit file sink, taking its folder (a folder another process holds is
// an error that names it), and logs a torn tail it healed.
func openAuditSink(cfg *config.Config, log *slog.Logger) (*audit.FileSink, error) {
	fc, err := audit.FileConfigFrom(cfg.Audit.File)
	if err != nil {
		return nil, fmt.Errorf("audit.file: %w", err)
	}
	sink, err := audit.OpenFileSink(fc)
	if err != nil {
		return nil, err
	}
	if rc := sink.Recovered(); rc != nil {
		log.Warn("the audit log ended with a torn tail (a crash during a write): it was cut and kept aside, "+
			"and the log records it (audit.recovered)", "file", rc.File, "bytes", rc.Bytes, "sha256", rc.SHA256,
			"offset", rc.Offset, "reason", rc.Reason)
	}
	return sink, nil
}

// newResolver picks the identity source: Kubernetes when enabled (with the NetworkPolicy
// controller when asked), else the static map of the config.
// sandboxGone is told of every deleted Sandbox (Kubernetes only; static sandboxes never go).
func newResolver(cfg *config.Config, log *slog.Logger, tel *telemetry.Telemetry, ready *readiness, sandboxGone func(key string)) (identity.Resolver, []component, error) {
	if !cfg.Kubernetes.Enabled {
		r, err := identity.NewStatic(cfg.Identity.Static)
		return r, nil, err
	}
	rc, err := kube.RESTConfig(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	client, dyn, err := kube.Clients(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	k, err := kubeid.NewKube(client, dyn, cfg.Kubernetes.Namespaces, log.With("component", "identity"), kubeid.WithRegisterer(tel.Registerer()))
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes identity: %w", err)
	}
	k.OnSandboxGone(sandboxGone)
	k.OnClaimGone(func(key string) {
		ns, claim, _ := strings.Cut(key, "/")
		sandboxGone(grants.ClaimKey(ns, claim))
	})
	ready.Add("kubernetes identity cache", synced(k.HasSynced))
	comps := []component{componentFunc(k.Run)}
	if cfg.Kubernetes.Controller.Enabled {
		c, err := kube.NewController(client, dyn, cfg.Kubernetes, log.With("component", "netpol-controller"), tel.Registerer())
		if err != nil {
			return nil, nil, fmt.Errorf("kubernetes controller: %w", err)
		}
		ready.Add("networkpolicy controller cache", synced(c.HasSynced))
		comps = append(comps, componentFunc(c.Run))
	}
	return k, comps, nil
}

func synced(f func() bool) func() error {
	return func() error {
		if !f() {
			return errors.New("caches not synced yet")
		}
		return nil
	}
}

func newLogger(env *cliEnv, lc config.Log) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(lc.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	w := env.stderr
	if w == nil {
		w = os.Stderr
	}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if lc.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	// A Redis outage fails every call that touches Redis, and an audit log that cannot be
	// written (a full disk, a reserve that does not fit) every call: one warning per message and
	// period says so, with the count of those held back, instead of one per call.
	h = telemetry.ThrottledHandler(h, telemetry.NewThrottle(warnPeriod, nil), func(r slog.Record) bool {
		return r.Level >= slog.LevelWarn && telemetry.RecordHasError(r, func(err error) bool {
			return errors.Is(err, redisconn.ErrUnavailable) || errors.Is(err, audit.ErrUnhealthy) ||
				errors.Is(err, audit.ErrReserveExhausted) || errors.Is(err, audit.ErrNotDelivered)
		})
	})
	return slog.New(h)
}

// warnPeriod is how often a warning about the same outage is repeated.
const warnPeriod = 10 * time.Second

// readiness is the set of named checks behind /readyz.
type readiness struct {
	mu       sync.Mutex
	checks   []namedCheck
	degraded []namedCheck
}

type namedCheck struct {
	name  string
	check func() error
}

// Add registers a check; /readyz fails while any check returns an error.
func (r *readiness) Add(name string, check func() error) {
	r.mu.Lock()
	r.checks = append(r.checks, namedCheck{name, check})
	r.mu.Unlock()
}

// AddDegraded registers a check whose failure /readyz reports under "degraded" without
// failing: the replica still serves, with the documented fallback.
func (r *readiness) AddDegraded(name string, check func() error) {
	r.mu.Lock()
	r.degraded = append(r.degraded, namedCheck{name, check})
	r.mu.Unlock()
}

// Check runs every check and returns each failure by name.
func (r *readiness) Check() (failures map[string]string) {
	r.mu.Lock()
	checks := append([]namedCheck(nil), r.checks...)
	r.mu.Unlock()
	return runChecks(checks)
}

// Degraded runs the AddDegraded checks and returns each failure by name.
func (r *readiness) Degraded() map[string]string {
	r.mu.Lock()
	checks := append([]namedCheck(nil), r.degraded...)
	r.mu.Unlock()
	return runChecks(checks)
}

func runChecks(checks []namedCheck) (failures map[string]string) {
	for _, c := range checks {
		if err := c.check(); err != nil {
			if failures == nil {
				failures = map[string]string{}
			}
			failures[c.name] = err.Error()
		}
	}
	return failures
}

// flushRejections writes the counts of suppressed rejection events every few seconds, so that
// a source that stopped sending garbage still has its count in the log soon after.
func flushRejections(ctx context.Context, core *call.Core) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			core.FlushRejections(ctx, false)
		}
	}
}

// replicaName is this replica's name: SANDGATE_REPLICA, else the pod's.
func replicaName(getenv func(string) string) string {
	if r := getenv("SANDGATE_REPLICA"); r != "" {
		return r
	}
	return getenv("POD_NAME")
}

// warnRecovered says so when the audit log ended with a torn tail that opening it cut.
func warnRecovered(sink audit.Sink, log *slog.Logger) {
	if r, ok := sink.(audit.Recoverer); ok && r.Recovered() != nil {
		rc := r.Recovered()
		log.Warn("the audit log ended with a torn tail (a crash during a write): it was cut and kept aside, "+
			"and the log records it (audit.recovered)", "file", rc.File, "bytes", rc.Bytes, "sha256", rc.SHA256,
			"offset", rc.Offset, "reason", rc.Reason)
	}
}

// closeUnless closes c unless *done says another owner took it.
func closeUnless(done *bool, c io.Closer) {
	if !*done {
		_ = c.Close()
	}
}
