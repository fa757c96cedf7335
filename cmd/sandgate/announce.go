package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/config"
)

// readyPoll is how often announceReady looks at the readiness checks until they first pass.
const readyPoll = 50 * time.Millisecond

// announceReady logs one line the first time every readiness check passes (what /readyz
// answers 200 to), saying where sandboxes and operators reach this replica. Whoever started
// serve by hand (`make run`) sees when it is ready and where; a log system gets how long the
// start took. It logs nothing if serve stops first.
func announceReady(listen config.Listen, ready *readiness, log *slog.Logger, started time.Time) component {
	return componentFunc(func(ctx context.Context) error {
		tick := time.NewTicker(readyPoll)
		defer tick.Stop()
		for len(ready.Check()) > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
		log.Info(readyMessage(listen), "after", time.Since(started).Round(time.Millisecond).String())
		return nil
	})
}

// readyMessage is the ready line: "ready: MCP at http://127.0.0.1:8080/mcp, proxy at
// 127.0.0.1:3128, admin at http://127.0.0.1:9090".
func readyMessage(listen config.Listen) string {
	var at []string
	if listen.MCP != "" {
		at = append(at, "MCP at http://"+listen.MCP+"/mcp")
	}
	if listen.Proxy != "" {
		at = append(at, "proxy at "+listen.Proxy)
	}
	if listen.Admin != "" {
		at = append(at, "admin at http://"+listen.Admin)
	}
	return "ready: " + strings.Join(at, ", ")
}
