package kubeid_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// TestLifecycleMetricsWithController runs the resolver beside the real Agent Sandbox controller:
// a warm pool's ready sandbox shows in the pool's gauge, a claim served from it is observed in
// the claim-to-ready histogram under the pool's name, a deleted sandbox in the lifetime
// histogram, and a deleted pool leaves no series behind.
func TestLifecycleMetricsWithController(t *testing.T) {
	cluster := kubetest.Start(t)
	cluster.StartController(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const ns = "agents"
	kubetest.Namespace(t, admin, ns, nil)
	kubetest.BindRules(t, admin, ns, kubetest.SandgateUser, kube.SandboxNamespaceRules(false))

	reg := prometheus.NewRegistry()
	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	r, err := kubeid.NewKube(client, dyn, []string{ns}, nil, kubeid.WithRegisterer(reg))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	require.True(t, r.WaitForSync(syncCtx), "caches sync")

	kubetest.Template(t, adminDyn, ns, "coding-agent", "Unmanaged")
	kubetest.WarmPool(t, adminDyn, ns, "wp-coding", "coding-agent", 1)
	pooled := waitForPod(t, admin, ns, func(name string) bool { return strings.HasPrefix(name, "wp-coding-") })
	kubetest.SetPodIPs(t, admin, ns, pooled, "10.3.0.1")
	setPodReady(t, admin, ns, pooled)

	pool := map[string]string{"sandbox_namespace": ns, "pool": "wp-coding"}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m := metric(t, reg, "sandgate_warm_pool_ready_sandboxes", pool)
		if assert.NotNil(c, m, "the pool has a gauge") {
			assert.Equal(c, 1.0, m.GetGauge().GetValue(), "one ready sandbox waits in the pool")
		}
	}, 60*time.Second, 50*time.Millisecond)

	kubetest.Claim(t, adminDyn, ns, "task-1", "wp-coding")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m := metric(t, reg, "sandgate_sandbox_claim_ready_seconds", pool)
		if assert.NotNil(c, m, "the claim's wait is observed under its pool") {
			assert.Equal(c, uint64(1), m.GetHistogram().GetSampleCount())
		}
	}, 60*time.Second, 50*time.Millisecond)
	h := metric(t, reg, "sandgate_sandbox_claim_ready_seconds", pool).GetHistogram()
	assert.Greater(t, h.GetSampleSum(), 0.0)
	assert.Less(t, h.GetSampleSum(), 60.0, "no longer than the test waited")

	require.NoError(t, adminDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Delete(ctx, pooled, metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m := metric(t, reg, "sandgate_sandbox_lifetime_seconds", map[string]string{"sandbox_namespace": ns})
		if assert.NotNil(c, m, "a deleted sandbox's lifetime is observed") {
			assert.GreaterOrEqual(c, m.GetHistogram().GetSampleCount(), uint64(1))
		}
	}, 60*time.Second, 50*time.Millisecond)

	require.NoError(t, adminDyn.Resource(kubetest.SandboxWarmPoolGVR).Namespace(ns).Delete(ctx, "wp-coding", metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Nil(c, metric(t, reg, "sandgate_warm_pool_ready_sandboxes", pool), "a deleted pool's gauge goes")
	}, 60*time.Second, 50*time.Millisecond)
}

// setPodReady marks a pod Running and Ready through the status subresource, as a kubelet would
// once its containers pass their readiness probes (the test cluster has no kubelet).
func setPodReady(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": "Running", "conditions": []any{
		map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": now},
		map[string]any{"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
	}}})
	_, err := cs.CoreV1().Pods(ns).Patch(context.Background(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	require.NoError(t, err, "mark pod %s/%s ready", ns, name)
}

// metric is the series of name whose labels include want, or nil.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range want {
				match = match && got[k] == v
			}
			if match {
				return m
			}
		}
	}
	return nil
}
