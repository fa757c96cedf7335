package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// Shutdown as Kubernetes expects it (docs/install.md, "Rollouts"). On SIGTERM:
//
//  1. /readyz answers 503 shutting_down at once, while both sandbox listeners keep serving for
//     shutdown.delay: the endpoints that still send sandboxes here learn the pod is going
//     before its ports close, so no sandbox gets "connection refused" during a rollout;
//  2. the listeners stop accepting and drain their calls for up to shutdown.drain;
//  3. what is left is cut, each cut call with its event (outcome error "shutdown"), and serve
//     waits for every call begun to have finished (cutWait);
//  4. the admin listener and the background loops stop, and serve closes the audit log last.
//
// A component that fails stops everything at once, as before.

// cutWait bounds the wait, after the listeners returned, for the calls they began to finish.
// Cut calls have only their event left to write, which takes milliseconds, and the wait ends
// as soon as they have; the bound is for a machine so loaded that they have not been scheduled
// yet. An event is worth more than a quick exit, and the chart's grace leaves 10 s past the
// drain for this and the audit flush.
const cutWait = 5 * time.Second

// shutdownState is what /readyz reads of the shutdown.
type shutdownState struct{ shutting atomic.Bool }

var errShuttingDown = errors.New("shutting_down: serving for shutdown.delay, then draining the calls in flight")

func (s *shutdownState) check() error {
	if s.shutting.Load() {
		return errShuttingDown
	}
	return nil
}

// runComponents runs listeners (the sandbox-facing ones) and background (everything else, the
// admin listener included) until ctx ends, then shuts down in the order above.
func runComponents(ctx context.Context, sh config.Shutdown, state *shutdownState, core *call.Core, listeners, background []component) error {
	g, gctx := errgroup.WithContext(context.Background())
	listenCtx, stopListening := context.WithCancel(gctx)
	defer stopListening()
	bgCtx, stopBackground := context.WithCancel(gctx)
	defer stopBackground()
	g.Go(func() error {
		select {
		case <-ctx.Done():
		case <-gctx.Done():
			return nil
		}
		state.shutting.Store(true)
		delay := time.NewTimer(sh.DelayD())
		defer delay.Stop()
		select {
		case <-delay.C:
		case <-gctx.Done():
		}
		stopListening()
		return nil
	})
	var served sync.WaitGroup
	for _, c := range listeners {
		served.Add(1)
		g.Go(func() error {
			defer served.Done()
			return c.Serve(listenCtx)
		})
	}
	for _, c := range background {
		g.Go(func() error { return c.Serve(bgCtx) })
	}
	g.Go(func() error {
		<-listenCtx.Done()
		served.Wait()
		wait, cancel := context.WithTimeout(context.Background(), cutWait)
		defer cancel()
		_ = core.Drained(wait) // the cut calls write their events
		stopBackground()
		return nil
	})
	return g.Wait()
}
