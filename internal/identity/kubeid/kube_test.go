package kubeid_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/test/kubetest"
)

// TestKubeResolver runs the resolver against a real kube-apiserver with the upstream CRDs,
// authenticated as a user holding only the identity rules (kube.SandboxNamespaceRules).
func TestKubeResolver(t *testing.T) {
	cluster := kubetest.Start(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	const ns = "agents"
	kubetest.Namespace(t, admin, ns, nil)
	kubetest.BindRules(t, admin, ns, kubetest.SandgateUser, kube.SandboxNamespaceRules(false))

	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	r, err := kubeid.NewKube(client, dyn, []string{ns}, nil)
	require.NoError(t, err)
	assert.False(t, r.Ready(), "not ready before the caches are filled")
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	require.True(t, r.WaitForSync(syncCtx), "caches sync")
	assert.True(t, r.Ready())

	engine, err := policy.New(ctx, filepath.Join(kubetest.RepoRoot(), "policies"))
	require.NoError(t, err)
	toolCall := func(id identity.Identity) policy.Decision {
		return engine.Decide(ctx, &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}})
	}

	ipA := netip.MustParseAddr("10.1.0.5")
	kubetest.WarmPool(t, adminDyn, ns, "wp-coding", "coding-agent", 0)
	claim := kubetest.Claim(t, adminDyn, ns, "claim-1", "wp-coding")
	sb1 := kubetest.Sandbox(t, adminDyn, ns, "sb-1", "coding-agent", claim)
	sb2 := kubetest.Sandbox(t, adminDyn, ns, "sb-2", "", nil)

	var sb1Pod *corev1.Pod

	t.Run("a pod with its IP set resolves to its sandbox, template and claim", func(t *testing.T) {
		sb1Pod = kubetest.SandboxPod(t, admin, sb1, "sb-1-pod", map[string]string{"team": "red"})
		kubetest.SetPodIPs(t, admin, ns, "sb-1-pod", ipA.String(), "fd00::5")
		kubetest.SetSandboxPodIPs(t, adminDyn, ns, "sb-1", ipA.String(), "fd00::5")
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
		// Creation times have a resolution of one second and the newer pod is the later one:
		// create the second pod in a later second than the first (the same second would leave
		// the order to the UIDs, which TestKubeNewestPodWins covers).
		require.NotNil(t, sb1Pod)
		require.Eventually(t, func() bool { return time.Now().Truncate(time.Second).After(sb1Pod.CreationTimestamp.Time) },
			2*time.Second, 10*time.Millisecond)
		kubetest.SandboxPod(t, admin, sb2, "sb-2-pod", nil)
		kubetest.SetPodIPs(t, admin, ns, "sb-2-pod", ipA.String())
		kubetest.SetSandboxPodIPs(t, adminDyn, ns, "sb-2", ipA.String())
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
		kubetest.SetSandboxPodIPs(t, adminDyn, ns, "sb-1", ipC.String())
		require.Eventually(t, func() bool { return r.Resolve(ipC).Known }, 10*time.Second, 20*time.Millisecond)
		assert.False(t, r.Resolve(ipB).Known, "ownerReference UID does not match the Sandbox")
		assert.Equal(t, "identity_unverified:sandbox", r.Resolve(ipB).Unverified)

		require.NoError(t, adminDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Delete(ctx, "sb-1", metav1.DeleteOptions{}))
		require.Eventually(t, func() bool { return !r.Resolve(ipC).Known }, 10*time.Second, 20*time.Millisecond)
	})

	t.Run("a pod the Sandbox does not name is an unknown caller until the controller names it", func(t *testing.T) {
		sb3 := kubetest.Sandbox(t, adminDyn, ns, "sb-3", "", nil)
		ipD := netip.MustParseAddr("10.1.0.8")
		kubetest.SandboxPod(t, admin, sb3, "sb-3-pod", nil)
		kubetest.SetPodIPs(t, admin, ns, "sb-3-pod", ipD.String())
		require.Eventually(t, func() bool { return r.Resolve(ipD).Unverified == "identity_unverified:pod" }, 10*time.Second, 20*time.Millisecond)
		assert.False(t, r.Resolve(ipD).Known)
		kubetest.SetSandboxPodIPs(t, adminDyn, ns, "sb-3", ipD.String())
		require.Eventually(t, func() bool { return r.Resolve(ipD).Known }, 10*time.Second, 20*time.Millisecond)
		assert.Empty(t, r.Resolve(ipD).Unverified)
	})
}

// TestKubeResolverWithController runs the resolver beside the upstream Agent Sandbox controller:
// a claim served from a warm pool resolves to the pool's sandbox with the pool's template and
// the claim; an unclaimed pool sandbox and a Sandbox its creator annotated with a template are
// unknown callers, the second logged and counted.
func TestKubeResolverWithController(t *testing.T) {
	cluster := kubetest.Start(t)
	cluster.StartController(t)
	admin, adminDyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const ns = "agents"
	kubetest.Namespace(t, admin, ns, nil)
	kubetest.BindRules(t, admin, ns, kubetest.SandgateUser, kube.SandboxNamespaceRules(false))

	var logs syncBuffer
	reg := prometheus.NewRegistry()
	client, dyn := kubetest.Clients(t, cluster.Sandgate)
	r, err := kubeid.NewKube(client, dyn, []string{ns}, slog.New(slog.NewTextHandler(&logs, nil)), kubeid.WithRegisterer(reg))
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
	ipPool := netip.MustParseAddr("10.2.0.1")
	kubetest.SetPodIPs(t, admin, ns, pooled, ipPool.String())

	t.Run("an unclaimed warm-pool sandbox is unknown: nothing the controller writes lists a pool's members", func(t *testing.T) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := r.Resolve(ipPool)
			assert.False(c, got.Known)
			assert.Equal(c, "identity_unverified:warm_pool", got.Unverified)
		}, 30*time.Second, 50*time.Millisecond)
	})

	t.Run("a claim adopts the pool's sandbox, which keeps the pool's name, and resolves to the claim", func(t *testing.T) {
		kubetest.Claim(t, adminDyn, ns, "task-2", "wp-coding")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := r.Resolve(ipPool)
			assert.Equal(c, "task-2", got.Claim)
			assert.Equal(c, pooled, got.Sandbox)
			assert.Equal(c, "coding-agent", got.Template)
		}, 30*time.Second, 50*time.Millisecond)
	})

	t.Run("a Sandbox created directly with a template annotation and hash label is an unknown caller", func(t *testing.T) {
		forged := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "forged", "namespace": ns,
				"annotations": map[string]any{identity.AnnotationTemplateRef: "coding-agent"},
				"labels":      map[string]any{identity.LabelTemplateRefHash: identity.NameHash("coding-agent")}},
			"spec": map[string]any{"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{identity.LabelTemplateRefHash: identity.NameHash("coding-agent")}},
				"spec":     kubetest.PodTemplate()["spec"]}},
		}}
		_, err := adminDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Create(ctx, forged, metav1.CreateOptions{})
		require.NoError(t, err)
		waitForPod(t, admin, ns, func(name string) bool { return name == "forged" })
		pod, err := admin.CoreV1().Pods(ns).Get(ctx, "forged", metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotContains(t, pod.Labels, identity.LabelTemplateRefHash, "the controller does not propagate a forged hash")
		ipForged := netip.MustParseAddr("10.2.0.9")
		kubetest.SetPodIPs(t, admin, ns, "forged", ipForged.String())
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Contains(c, logs.String(), "unverified=identity_unverified:template")
		}, 30*time.Second, 50*time.Millisecond)
		assert.False(t, r.Resolve(ipForged).Known, "an unverifiable template is an unknown caller")
		assert.Equal(t, "identity_unverified:template", r.Resolve(ipForged).Unverified)
		assert.Contains(t, logs.String(), "pod=agents/forged")
		assert.InDelta(t, 1, counterValue(t, reg, "template"), 0)
		assert.True(t, r.Resolve(ipPool).Known, "the real sandbox still resolves")
		assert.NotContains(t, logs.String(), "unverified=identity_unverified:claim", "adoption is not a refusal")
		assert.Zero(t, counterValue(t, reg, "warm_pool"), "an idle pool sandbox is not a refusal")
	})
}

// waitForPod waits until a pod whose name matches exists in ns (the controller creates it) and
// returns its name.
func waitForPod(t *testing.T, cs kubernetes.Interface, ns string, match func(string) bool) string {
	t.Helper()
	var found string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		require.NoError(c, err)
		for _, p := range pods.Items {
			if match(p.Name) {
				found = p.Name
			}
		}
		assert.NotEmpty(c, found)
	}, 60*time.Second, 100*time.Millisecond)
	return found
}

func counterValue(t *testing.T, reg *prometheus.Registry, link string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "link" && l.GetValue() == link {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// syncBuffer is a bytes.Buffer safe for the informer goroutines that log into it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
