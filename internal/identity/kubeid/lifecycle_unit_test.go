package kubeid

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The pool label stays a bounded set: pools past maxPoolLabels, and claims naming a pool that
// does not exist, go under "other"; a deleted pool frees its place. The claim's wait is timed
// by the injected clock from its creation event, not from its (second-granular) timestamp.
func TestLifecyclePoolLabelIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLifecycle(func() time.Time { return now })
	pool := func(name string, ready int64) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name, "namespace": "agents"},
			"status":   map[string]any{"readyReplicas": ready}}}
	}
	for i := range maxPoolLabels + 10 {
		l.poolChanged(pool(fmt.Sprintf("pool-%d", i), 2))
	}
	assert.Equal(t, maxPoolLabels, testutil.CollectAndCount(l.poolReady), "one gauge per labelled pool, no more")
	assert.InDelta(t, 2, testutil.ToFloat64(l.poolReady.WithLabelValues("agents", "pool-0")), 0)

	claim := func(name, pool string, ready bool) *unstructured.Unstructured {
		c := &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name, "namespace": "agents"},
			"spec":     map[string]any{"warmPoolRef": map[string]any{"name": pool}}}}
		if ready {
			c.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
		}
		return c
	}
	for _, p := range []string{"pool-1", "made-up", fmt.Sprintf("pool-%d", maxPoolLabels+5)} {
		l.claimAdded(claim("c-"+p, p, false), false)
	}
	l.claimAdded(claim("listed", "pool-1", false), true)
	now = now.Add(1500 * time.Millisecond)
	for _, p := range []string{"pool-1", "made-up", fmt.Sprintf("pool-%d", maxPoolLabels+5)} {
		l.claimUpdated(claim("c-"+p, p, true))
	}
	l.claimUpdated(claim("listed", "pool-1", true))
	assert.Equal(t, 2, testutil.CollectAndCount(l.claimReady), `"pool-1" and "other"`)
	var m dto.Metric
	require.NoError(t, l.claimReady.WithLabelValues("agents", "pool-1").(prometheus.Histogram).Write(&m))
	assert.Equal(t, uint64(1), m.GetHistogram().GetSampleCount(), "the claim of the initial list is not timed")
	assert.InDelta(t, 1.5, m.GetHistogram().GetSampleSum(), 1e-9, "from its creation event, by the clock")
	require.NoError(t, l.claimReady.WithLabelValues("agents", "other").(prometheus.Histogram).Write(&m))
	assert.Equal(t, uint64(2), m.GetHistogram().GetSampleCount(), "a made-up pool and one past the bound")
	assert.Empty(t, l.pending)

	l.poolDeleted(pool("pool-0", 0))
	l.poolChanged(pool("late", 1))
	assert.InDelta(t, 1, testutil.ToFloat64(l.poolReady.WithLabelValues("agents", "late")), 0, "a deleted pool frees its place")
	assert.Equal(t, maxPoolLabels, testutil.CollectAndCount(l.poolReady))
}
