package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"golang.org/x/time/rate"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// auditExport is what follows the audit file to somewhere else: the Redis Stream mirror (made
// with the shared state) and the OTLP exporter (audit.otlp). Each reads the file after it is
// written, so neither stands in the way of a call; each wakes when the writer writes.
type auditExport struct {
	mirror *audit.StreamMirror // nil without the Redis audit stream
	otlp   *audit.OTLPExporter // nil without audit.otlp
	log    *slog.Logger
}

// newAuditExport builds the OTLP exporter when audit.otlp asks for one, registers the
// followers' metrics and their degraded readiness notes: a destination that cannot be reached
// leaves the replica ready (every event is in its file, and is sent when it returns).
func newAuditExport(cfg *config.Config, creds *credential.Store, replica string, mirror *audit.StreamMirror,
	log *slog.Logger, getenv func(string) string, mp metric.MeterProvider, ready *readiness) (*auditExport, error) {
	x := &auditExport{mirror: mirror, log: log.With("component", "audit-export")}
	if oc := cfg.Audit.OTLP; oc.On() {
		ocfg, err := otlpConfig(cfg, creds, replica, getenv)
		if err != nil {
			return nil, err
		}
		// A Collector that refuses records for good (a partial success) is told once per 10s
		// at most: under load every batch may carry some.
		warn := rate.NewLimiter(rate.Every(10*time.Second), 1)
		ocfg.Follower.OnRejected = func(err error) {
			if warn.Allow() {
				x.log.Warn("the Collector refused audit records for good; they stay in the audit file and are not sent again",
					"err", err)
			}
		}
		if x.otlp, err = audit.NewOTLPExporter(ocfg); err != nil {
			return nil, fmt.Errorf("audit.otlp: %w", err)
		}
		ready.AddDegraded("audit otlp export", x.otlp.Healthy)
		x.log.Info("audit log exported over OTLP", "protocol", ocfg.Protocol, "endpoint", otlpEndpointForLog(ocfg, getenv),
			"batch", ocfg.Follower.Batch)
	}
	for _, f := range x.followers() {
		if err := observeFollower(mp, f.name, f.Follower); err != nil {
			x.close()
			return nil, err
		}
	}
	return x, nil
}

// otlpConfig is audit.otlp with the auth header's credential, the protocol the environment
// names when the config does not, and this replica's resource.
func otlpConfig(cfg *config.Config, creds *credential.Store, replica string, getenv func(string) string) (audit.OTLPConfig, error) {
	oc := cfg.Audit.OTLP
	tlsConf, err := oc.TLS.Config("audit.otlp.tls")
	if err != nil {
		return audit.OTLPConfig{}, err
	}
	out := audit.OTLPConfig{Dir: cfg.Audit.File.Dir, Protocol: oc.Protocol, Endpoint: oc.Endpoint, Insecure: oc.Insecure,
		Headers: oc.Headers, TLS: tlsConf, Timeout: oc.Timeout.D(), Follower: audit.FollowerConfig{Batch: oc.Batch}}
	if out.Protocol == "" {
		out.Protocol = firstNonEmpty(getenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), audit.OTLPProtocolHTTP)
	}
	if ref := oc.HeaderCredential; ref != nil {
		if _, ok := creds.Get(ref.Name); !ok {
			return audit.OTLPConfig{}, fmt.Errorf("audit.otlp.header_credential: credential %q is not available", ref.Name)
		}
		out.Auth = func() (string, string) {
			v, ok := creds.Get(ref.Name)
			if !ok {
				return "", ""
			}
			return ref.Header, ref.Render(v)
		}
	}
	if replica == "" {
		replica, _ = os.Hostname()
	}
	// Later options win: the environment's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over
	// Sandgate's defaults.
	out.Resource, err = resource.New(context.Background(),
		resource.WithAttributes(attribute.String("service.name", "sandgate"), attribute.String("service.instance.id", replica)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return audit.OTLPConfig{}, fmt.Errorf("audit.otlp: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return out, nil
}

// otlpEndpointForLog is where the exporter sends, for the start-up log line: the configured
// endpoint or the environment's (without its user info; headers are never logged).
func otlpEndpointForLog(c audit.OTLPConfig, getenv func(string) string) string {
	return firstNonEmpty(c.Endpoint, getenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "(the exporter's default)")
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// namedFollower is a follower with its metric label (destination: a closed set).
type namedFollower struct {
	name string
	*audit.Follower
}

func (x *auditExport) followers() []namedFollower {
	var fs []namedFollower
	if x.mirror != nil {
		fs = append(fs, namedFollower{"redis_stream", x.mirror.Follower})
	}
	if x.otlp != nil {
		fs = append(fs, namedFollower{"otlp", x.otlp.Follower})
	}
	return fs
}

// wrapSink makes each audit write wake the followers at once instead of at their next poll.
func (x *auditExport) wrapSink(sink audit.Sink) audit.Sink {
	var fs []*audit.Follower
	for _, f := range x.followers() {
		fs = append(fs, f.Follower)
	}
	return audit.NotifyingSink(sink, fs...)
}

// components are the OTLP exporter's loop (the mirror's is the shared state's).
func (x *auditExport) components() []component {
	if x.otlp == nil {
		return nil
	}
	return []component{componentFunc(func(ctx context.Context) error {
		_ = x.otlp.Run(ctx) // returns ctx's error: a normal stop
		return nil
	})}
}

// sync sends what the writer flushed last (call after the writer is closed), within ctx; what
// is not sent then goes at the next start, from the cursor.
func (x *auditExport) sync(ctx context.Context) {
	if x.otlp == nil {
		return
	}
	if err := x.otlp.Sync(ctx); err != nil {
		x.log.Warn("audit log not fully exported over OTLP on shutdown; the next start continues from the file", "err", err)
	}
}

// close releases the OTLP exporter's connection.
func (x *auditExport) close() {
	if x.otlp != nil {
		_ = x.otlp.Shutdown(context.Background())
	}
}

// syncAll runs the followers' shutdown syncs side by side, so that a destination that is away
// does not use up the other's time.
func syncAll(syncs ...func()) {
	var wg sync.WaitGroup
	for _, s := range syncs {
		wg.Go(s)
	}
	wg.Wait()
}
