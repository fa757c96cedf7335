package deploy

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/identity/kubeid"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// Namespaces of identityRig: the chart's identity admission policies are bound to guarded only.
const (
	guarded = "guarded"
	open    = "open"
)

// Templates and pools of identityRig, in both namespaces: wp-a serves templateA (two warm
// sandboxes), wp-b templateB (cold starts only), wp-repoint templateA until a test re-points it.
const (
	templateA = "agent-a"
	templateB = "agent-b"
)

// identityRig is a cluster of one Agent Sandbox release: its controller, the chart's identity
// admission policies bound to the namespace guarded (open has none), a tenant holding
// kubetest.TenantRules in both, kubelets giving pods addresses, and Sandgate's resolver watching
// both as the sandgate user with the identity rules only.
type identityRig struct {
	cluster                     *kubetest.Cluster
	admin, tenant               kubernetes.Interface
	adminDyn, tenantDyn, ctlDyn dynamic.Interface
	resolver                    *kubeid.Kube
	stopController              func()
	ctx                         context.Context
}

func newIdentityRig(t *testing.T, release kubetest.Release) *identityRig {
	t.Helper()
	rig := &identityRig{cluster: kubetest.StartRelease(t, release), ctx: context.Background()}
	rig.admin, rig.adminDyn = kubetest.Clients(t, rig.cluster.Admin)
	rig.tenant, rig.tenantDyn = kubetest.Clients(t, rig.cluster.Tenant)
	_, rig.ctlDyn = kubetest.Clients(t, rig.cluster.Controller)
	for i, ns := range []string{guarded, open} {
		kubetest.Namespace(t, rig.admin, ns, nil)
		kubetest.BindRules(t, rig.admin, ns, kubetest.TenantUser, kubetest.TenantRules())
		kubetest.BindRules(t, rig.admin, ns, kubetest.SandgateUser, kube.SandboxNamespaceRules(false))
		kubetest.AssignPodIPs(t, rig.admin, ns, 20+i)
	}
	rig.installIdentityPolicy(t)
	rig.stopController = rig.cluster.StartController(t)
	for _, ns := range []string{guarded, open} {
		kubetest.Template(t, rig.ctlDyn, ns, templateA, kube.Unmanaged)
		kubetest.Template(t, rig.ctlDyn, ns, templateB, kube.Unmanaged)
		kubetest.WarmPool(t, rig.ctlDyn, ns, "wp-a", templateA, 2)
		kubetest.WarmPool(t, rig.ctlDyn, ns, "wp-b", templateB, 0)
		kubetest.WarmPool(t, rig.ctlDyn, ns, "wp-repoint", templateA, 1)
	}
	rig.startResolver(t)
	return rig
}

// installIdentityPolicy applies the chart's identity and host-namespace policies with
// sandboxNamespaces [guarded], and waits until the apiserver enforces them.
func (rig *identityRig) installIdentityPolicy(t *testing.T) {
	t.Helper()
	values := filepath.Join(t.TempDir(), "values.yaml")
	require.NoError(t, os.WriteFile(values, []byte("sandboxNamespaces: ["+guarded+"]\n"), 0o600))
	objs := render(t, chartCase{name: "guarded", values: values}, "sandgate", "sandgate")
	mapper := newMapper(t, rig.admin)
	for _, o := range append(find(objs, "ValidatingAdmissionPolicy"), find(objs, "ValidatingAdmissionPolicyBinding")...) {
		if strings.HasSuffix(o.GetName(), "-identity") || strings.HasSuffix(o.GetName(), "-host-namespaces") {
			apply(t, rig.ctx, rig.adminDyn, mapper, o)
		}
	}
	require.Eventually(t, func() bool {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: guarded,
			Labels: map[string]string{identity.LabelSandboxNameHash: identity.NameHash("anything")}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "example.invalid/x:1"}}}}
		_, err := rig.tenant.CoreV1().Pods(guarded).Create(rig.ctx, p, metav1.CreateOptions{})
		return apierrors.IsForbidden(err)
	}, 60*time.Second, 100*time.Millisecond, "the identity policy is not enforced")
}

func (rig *identityRig) startResolver(t *testing.T) {
	t.Helper()
	client, dyn := kubetest.Clients(t, rig.cluster.Sandgate)
	r, err := kubeid.NewKube(client, dyn, []string{guarded, open}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(rig.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, syncCancel := context.WithTimeout(ctx, 60*time.Second)
	defer syncCancel()
	require.True(t, r.WaitForSync(syncCtx), "the resolver's caches sync")
	rig.resolver = r
}

// sandboxUnderTest is a sandbox the controller made for a tenant's claim, verified by Sandgate.
type sandboxUnderTest struct {
	ns, claim, sandbox, pod, template string
	ip                                netip.Addr
}

// own is the identity Sandgate gives the sandbox while every fact holds.
func (s sandboxUnderTest) own() identity.Identity {
	return identity.Identity{Namespace: s.ns, Sandbox: s.sandbox, Template: s.template, Claim: s.claim, SourceIP: s.ip.String(), Known: true}
}

// claimed has the tenant claim a sandbox from pool in ns, and waits until the controller has
// bound it, its pod has an address and Sandgate resolves the address as the claim's sandbox.
func (rig *identityRig) claimed(t *testing.T, ns, claim, pool, template string) sandboxUnderTest {
	t.Helper()
	kubetest.Claim(t, rig.tenantDyn, ns, claim, pool)
	s := sandboxUnderTest{ns: ns, claim: claim, template: template}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		cl, err := rig.adminDyn.Resource(kubetest.SandboxClaimGVR).Namespace(ns).Get(rig.ctx, claim, metav1.GetOptions{})
		require.NoError(c, err)
		s.sandbox, _, _ = unstructured.NestedString(cl.Object, "status", "sandbox", "name")
		require.NotEmpty(c, s.sandbox, "claim %s/%s not bound yet", ns, claim)
		s.pod, s.ip = rig.podOf(c, ns, s.sandbox)
		got := rig.resolver.Resolve(s.ip)
		got.Labels = nil
		assert.Equal(c, s.own(), got)
	}, 90*time.Second, 100*time.Millisecond, "claim %s/%s never became a verified sandbox", ns, claim)
	return s
}

// plainSandbox has the tenant create a Sandbox of its own and waits until Sandgate resolves its
// pod as that sandbox, without template or claim.
func (rig *identityRig) plainSandbox(t *testing.T, ns, name string) sandboxUnderTest {
	t.Helper()
	sb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"podTemplate": kubetest.PodTemplate()}}}
	_, err := rig.tenantDyn.Resource(kubetest.SandboxGVR).Namespace(ns).Create(rig.ctx, sb, metav1.CreateOptions{})
	require.NoError(t, err)
	s := sandboxUnderTest{ns: ns, sandbox: name}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s.pod, s.ip = rig.podOf(c, ns, name)
		got := rig.resolver.Resolve(s.ip)
		got.Labels = nil
		assert.Equal(c, s.own(), got)
	}, 90*time.Second, 100*time.Millisecond, "Sandbox %s/%s never became a verified sandbox", ns, name)
	return s
}

// podOf returns the name and address of the pod sandbox controls.
func (rig *identityRig) podOf(c *assert.CollectT, ns, sandbox string) (string, netip.Addr) {
	pods, err := rig.admin.CoreV1().Pods(ns).List(rig.ctx, metav1.ListOptions{})
	require.NoError(c, err)
	for _, p := range pods.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "Sandbox" && ref.Name == sandbox && p.Status.PodIP != "" {
			return p.Name, netip.MustParseAddr(p.Status.PodIP)
		}
	}
	require.Fail(c, "no pod with an address", "Sandbox %s/%s", ns, sandbox)
	return "", netip.Addr{}
}

// mergePatch is an RFC 7386 patch body.
func mergePatch(v map[string]any) []byte {
	b, _ := json.Marshal(v)
	return b
}
