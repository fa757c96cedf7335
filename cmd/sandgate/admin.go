package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/identity"
)

// newAdminComponent serves the admin listener: /healthz (the process answers), /readyz (every
// readiness check passes; degraded shared state is reported but does not fail it, and neither
// does a failed policy reload or watch: the last good revision serves, "policy" says "degraded"
// and "degraded"."policy" says why), /metrics,
// and the grants API under /v1/grants/ (bearer token admin.token_credential, read on every
// request so a rotated token applies at once; without admin.token_credential the API answers 404).
// It must never be reachable from sandboxes: the generated NetworkPolicy admits only the
// monitoring selector to this port, and every known sandbox address gets 403 (refuseSandboxes).
func newAdminComponent(d *serveDeps, metrics http.Handler) component {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		failures, degraded := d.ready.Check(), d.ready.Degraded()
		policyState := "ok"
		if d.policy.Status().Degraded() {
			policyState = "degraded"
		}
		w.Header().Set("Content-Type", "application/json")
		if len(failures) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "failing": failures, "degraded": degraded, "policy": policyState})
			return
		}
		body := map[string]any{"ready": true, "policy_revision": d.policy.Revision(), "policy": policyState}
		if len(degraded) > 0 {
			body["degraded"] = degraded
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", metrics)
	mux.Handle("/v1/grants/", grantsAPI(d))
	if d.cfg.Admin.Pprof {
		// Profiling for benchmarks and incidents; off by default. Like everything on this port,
		// it is reachable only from the monitoring selector, never from sandboxes.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return httpComponent("admin", d.cfg.Listen.Admin, refuseSandboxes(d, mux), d)
}

// refuseSandboxes answers 403 to every address that is a known sandbox, whatever the admin
// listener's bind address: the NetworkPolicy keeps sandboxes off this port in a cluster, and
// this keeps them off where there is none (a local run, a policy not applied yet). The refusal
// is a sandbox-facing request like any other, so it is audited (http.rejected,
// admin_from_sandbox).
func refuseSandboxes(d *serveDeps, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := identity.FromRemoteAddr(d.identity, r.RemoteAddr)
		if !id.Known {
			next.ServeHTTP(w, r)
			return
		}
		rf := call.Refuse(call.CodeAdminFromSandbox, "the admin API is not for sandboxes")
		rf = d.core.Reject(r.Context(), audit.KindHTTPRejected, id, audit.Target{Method: r.Method, Path: r.URL.Path}, rf)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rf.Status())
		_ = json.NewEncoder(w).Encode(map[string]string{"error": rf.Reason, "code": rf.Code})
	})
}

// grantsAPI is the grants admin API, or a 404 that says how to enable it.
func grantsAPI(d *serveDeps) http.Handler {
	name := d.cfg.Admin.TokenCredential
	if name == "" || d.grants == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{
				"error": "the admin API is disabled: set admin.token_credential to the name of a credential holding its bearer token"})
		})
	}
	return grants.NewHandler(d.grants, func() string {
		v, _ := d.creds.Get(name)
		return v
	})
}

// listenerComponent listens on addr and hands the listener to serve, which runs until ctx
// ends and then shuts down gracefully. An empty addr disables it.
//
// The replica is not ready before the listener is bound: the components start side by side,
// and /readyz (served by the admin listener, often up first) answering 200 while the MCP port
// still refuses connections would send a Service's first requests nowhere.
func listenerComponent(name, addr string, d *serveDeps, serve func(ctx context.Context, ln net.Listener) error) component {
	var bound atomic.Bool
	if addr != "" && name != "admin" {
		d.ready.Add(name+" listener", func() error {
			if !bound.Load() {
				return errNotListening
			}
			return nil
		})
	}
	return componentFunc(func(ctx context.Context) error {
		if addr == "" {
			<-ctx.Done()
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s listener: %w", name, err)
		}
		bound.Store(true)
		d.log.Info("listening", "listener", name, "addr", ln.Addr().String())
		switch name { // the sandbox-facing listeners: connections per source address are capped
		case "mcp":
			ln = d.core.LimitPerSource(ln, d.cfg.Listen.MaxConnsPerSource, audit.KindMCPRejected, d.identity)
		case "proxy":
			ln = d.core.LimitPerSource(ln, d.cfg.Listen.MaxConnsPerSource, audit.KindHTTPRejected, d.identity)
		}
		return serve(ctx, ln)
	})
}

var errNotListening = errors.New("not listening yet")

// httpComponent runs an http.Server on addr until ctx ends, then shuts it down gracefully
// within adminGrace. An empty addr disables it.
func httpComponent(name, addr string, h http.Handler, d *serveDeps) component {
	return listenerComponent(name, addr, d, func(ctx context.Context, ln net.Listener) error {
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
		}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return fmt.Errorf("%s listener: %w", name, err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), adminGrace)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s shutdown: %w", name, err)
		}
		return nil
	})
}
