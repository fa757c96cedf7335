package identity_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/test/kubetest"
)

// TestKubeResolver runs the resolver against a real kube-apiserver, authenticated as a user
// holding only the identity rules (pods and sandboxes: get, list, watch).
func TestKubeResolver(t *testing.T) {
	cluster := kubetest.Start(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	const ns = "agents"
	kubetest.Namespace(t, admin, ns, nil)
	kubetest.BindRules(t, admin, ns, kubetest.SandgateUser, kube.SandboxNamespaceRules(false))

	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	r, err := identity.NewKube(client, dyn, []string{ns}, nil)
	require.NoError(t, err)
	assert.False(t, r.Ready(), "not ready before the caches are filled")
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	require.True(t, r.WaitForSync(syncCtx), "caches sync")
	assert.True(t, r.Ready())

	engine, err := policy.New(ctx, "../../policies")
	require.NoError(t, err)
	toolCall := func(id identity.Identity) policy.Decision {
		return engine.Decide(ctx, &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}})
	}

	ipA := netip.MustParseAddr("10.1.0.5")
	kubetest.WarmPool(t, adminDyn, ns, "wp-coding", "coding-agent", 0)
	claim := kubetest.Claim(t, adminDyn, ns, "claim-1", "wp-coding")
	sb1 := kubetest.Sandbox(t, adminDyn, ns, "sb-1", "coding-agent", claim)
	sb2 := kubetest.Sandbox(t, adminDyn, ns, "sb-2", "", nil)

	t.Run("a pod with its IP set resolves to its sandbox, template and claim", func(t *testing.T) {
		kubetest.SandboxPod(t, admin, sb1, "sb-1-pod", map[string]string{"team": "red"})
		kubetest.SetPodIPs(t, admin, ns, "sb-1-pod", ipA.String(), "fd00::5")
		want := identity.Identity{Namespace: ns, Sandbox: "sb-1", Template: "coding-agent", Claim: "claim-1", SourceIP: ipA.String(), Known: true}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := r.Resolve(ipA)
			got.Labels = nil
			assert.Equal(c, want, got)
		}, 10*time.Second, 20*time.Millisecond)
		got := r.Resolve(ipA)
		assert.Equal(t, "red", got.Labels["team"])
		assert.Equal(t, "sb-1", r.Resolve(netip.MustParseAddr("fd00::5")).Sandbox, "every podIP maps, IPv6 included")
		assert.Equal(t, "sb-1", r.Resolve(netip.MustParseAddr("::ffff:10.1.0.5")).Sandbox, "IPv4-mapped IPv6 is the same caller")
	})

	t.Run("an unknown IP is anonymous and the shipped policy denies it", func(t *testing.T) {
		id := r.Resolve(netip.MustParseAddr("10.9.9.9"))
		assert.False(t, id.Known)
		assert.Equal(t, "anonymous", id.Key())
		assert.Equal(t, "10.9.9.9", id.SourceIP)
		d := toolCall(id)
		assert.False(t, d.Allow)
		assert.Equal(t, "unknown_identity", d.Code)
	})

	t.Run("an IP reassigned to another pod maps to the new pod only", func(t *testing.T) {
		kubetest.SandboxPod(t, admin, sb2, "sb-2-pod", nil)
		kubetest.SetPodIPs(t, admin, ns, "sb-2-pod", ipA.String())
		require.Eventually(t, func() bool { return r.Resolve(ipA).Sandbox == "sb-2" }, 10*time.Second, 20*time.Millisecond)
		id := r.Resolve(ipA)
		assert.Empty(t, id.Template, "sb-2 has no template")
		assert.Empty(t, id.Claim, "sb-2 has no claim")
		// The old pod going away must not take the address from the new one.
		require.NoError(t, admin.CoreV1().Pods(ns).Delete(ctx, "sb-1-pod", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool { return !r.Resolve(netip.MustParseAddr("fd00::5")).Known }, 10*time.Second, 20*time.Millisecond)
		assert.Equal(t, "sb-2", r.Resolve(ipA).Sandbox)
	})

	t.Run("a deleted pod stops mapping and is then denied", func(t *testing.T) {
		require.NoError(t, admin.CoreV1().Pods(ns).Delete(ctx, "sb-2-pod", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool { return !r.Resolve(ipA).Known }, 10*time.Second, 20*time.Millisecond)
		assert.False(t, toolCall(r.Resolve(ipA)).Allow)
	})

	t.Run("a pod whose Sandbox is gone, or that only claims a Sandbox, stays anonymous", func(t *testing.T) {
		ipB := netip.MustParseAddr("10.1.0.6")
		forged := sb1.DeepCopy()
		forged.SetUID("00000000-0000-0000-0000-000000000000")
		kubetest.SandboxPod(t, admin, forged, "forged-owner", nil)
		kubetest.SetPodIPs(t, admin, ns, "forged-owner", ipB.String())
		ipC := netip.MustParseAddr("10.1.0.7")
		kubetest.SandboxPod(t, admin, sb1, "sb-1-second", nil)
		kubetest.SetPodIPs(t, admin, ns, "sb-1-second", ipC.String())
		require.Eventually(t, func() bool { return r.Resolve(ipC).Known }, 10*time.Second, 20*time.Millisecond)
		assert.False(t, r.Resolve(ipB).Known, "ownerReference UID does not match the Sandbox")

		require.NoError(t, adminDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Delete(ctx, "sb-1", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool { return !r.Resolve(ipC).Known }, 10*time.Second, 20*time.Millisecond)
	})
}
