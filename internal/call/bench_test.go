package call_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// processCPU is the CPU time the whole process has used (user + system), every goroutine's:
// under a shared, busy machine it varies less than wall time, and it counts the decision log's
// writer and the shadow's workers, which wall time per call hides.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lastShadowDone queues one more call and returns when the shadow has evaluated it: the queue
// is FIFO, so the shadow's backlog is then done and its CPU counted.
func lastShadowDone(b *testing.B, core *call.Core, id identity.Identity) <-chan struct{} {
	cl, _, _ := runCall(context.Background(), core, audit.KindToolsCall, id,
		call.Question{Input: &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "github", Tool: "search_code"}}}, nil)
	if cl.Shadow() == nil {
		b.Fatal("the last call was not shadowed")
	}
	return cl.Shadow().Done()
}

// discardAudit records nothing: the benchmark measures the decision step and what the decision
// log and the shadow add to it, not the audit sink.
type discardAudit struct{}

func (discardAudit) Record(*audit.Event) error { return nil }
func (discardAudit) Healthy() error            { return nil }

// BenchmarkCallDecision is one tools/call through the request path (Begin, Authorize, Finish)
// under the shipped policies, with the decision cache on (the default; 64 sandboxes) or off
// (every call evaluated), and the decision log and a shadow policy (the shipped policies
// again, same cache setting) off and on. It reports the
// caller's time per call; the decision log's writer and the shadow's workers run on their own
// goroutines, and what they could not keep up with is reported as dropped/op.
func BenchmarkCallDecision(b *testing.B) {
	type variant struct {
		name        string
		cache       int
		log, shadow bool
	}
	var variants []variant
	for _, cache := range []int{policy.DefaultCacheEntries, 0} {
		for _, ls := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			variants = append(variants, variant{fmt.Sprintf("cache=%t/log=%t/shadow=%t", cache > 0, ls[0], ls[1]), cache, ls[0], ls[1]})
		}
	}
	for _, bc := range variants {
		b.Run(bc.name, func(b *testing.B) {
			ctx := b.Context()
			engine, err := policy.New(ctx, "../../policies", policy.WithDecisionCache(bc.cache))
			require.NoError(b, err)
			opts := call.Options{Policy: engine, Audit: discardAudit{}}
			var dl *policy.DecisionLog
			if bc.log {
				dl, err = policy.OpenDecisionLog(policy.DecisionLogConfig{File: filepath.Join(b.TempDir(), "decisions.log")})
				require.NoError(b, err)
				opts.Decisions = dl
			}
			var shadow *policy.Shadow
			if bc.shadow {
				se, err := policy.New(ctx, "../../policies", policy.WithDecisionCache(bc.cache))
				require.NoError(b, err)
				shadow = policy.NewShadow(se, policy.ShadowConfig{})
				go func() { _ = shadow.Run(ctx) }()
				opts.Shadow = shadow
			}
			core, err := call.New(opts)
			require.NoError(b, err)
			ids := make([]identity.Identity, 64)
			for i := range ids {
				ids[i] = identity.Identity{Namespace: "agents", Sandbox: "sb-" + strconv.Itoa(i), Template: "coding-agent", SourceIP: "127.0.0.2", Known: true}
			}
			b.ReportAllocs()
			cpu0 := processCPU(b)
			i := 0
			for b.Loop() {
				id := ids[i%len(ids)]
				i++
				in := &policy.Input{Kind: audit.KindToolsCall, Identity: id,
					MCP: &policy.MCP{Upstream: "github", Tool: "search_code", Arguments: map[string]any{"q": "func main", "page": i}}}
				if _, _, rf := runCall(context.Background(), core, audit.KindToolsCall, id, call.Question{Input: in}, nil); rf != nil {
					b.Fatalf("refused: %+v", rf)
				}
			}
			var dropped uint64
			if dl != nil {
				require.NoError(b, dl.Close()) // the writer's backlog is part of the cost
				dropped += dl.Dropped()
			}
			if shadow != nil {
				<-lastShadowDone(b, core, ids[0])
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(i), "cpu-ns/op")
			if shadow != nil {
				dropped += shadow.Counts().Dropped
			}
			b.ReportMetric(float64(dropped)/float64(i), "dropped/op")
		})
	}
}
