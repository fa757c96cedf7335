package kube

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A reconcile whose write meets a conflict is retried later with exponential backoff, not at
// once: the namespace is requeued rate-limited, each failure doubling the wait, until a
// reconcile succeeds (Forget).
func TestReconcileBacksOffOnConflict(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("patch", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, "x", nil)
	})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		SandboxTemplateGVR: "SandboxTemplateList"})
	cfg := testConfig(true)
	c, err := NewController(client, dyn, cfg, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()

	for attempt := 1; attempt <= 3; attempt++ {
		c.queue.Add("sandboxes")
		require.True(t, c.processNext(ctx))
		// The exponential limiter counts failures per item: its delay is 5 ms × 2^(failures-1).
		assert.Equal(t, attempt, c.queue.NumRequeues("sandboxes"), "requeued rate-limited")
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(c.reconciles.WithLabelValues("error")))
	assert.Zero(t, testutil.ToFloat64(c.reconciles.WithLabelValues("ok")))
}
