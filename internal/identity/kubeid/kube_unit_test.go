package kubeid

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandgate/sandgate/internal/identity"
)

// fakeSandbox is a Sandbox whose status.podIPs (the controller's) name podIPs.
func fakeSandbox(name, uid string, podIPs ...string) *unstructured.Unstructured {
	sb := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": uid}}}
	if len(podIPs) > 0 {
		ips := make([]any, 0, len(podIPs))
		for _, ip := range podIPs {
			ips = append(ips, ip)
		}
		sb.Object["status"] = map[string]any{"podIPs": ips}
	}
	return sb
}

func fakePod(name, sandbox, uid, ip string) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("pod-" + name), Labels: map[string]string{identity.LabelSandboxNameHash: identity.NameHash(sandbox)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: sandbox, UID: types.UID(uid), Controller: &yes}}},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func fakeDynamic() *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		SandboxResource(): "SandboxList", SandboxClaimResource(): "SandboxClaimList", SandboxWarmPoolResource(): "SandboxWarmPoolList"})
}

// startKube runs a resolver on fakes holding sandboxes (created through the resource, not the
// constructor: the fake would guess "sandboxs").
func startKube(t *testing.T, sandboxes ...*unstructured.Unstructured) (*Kube, *nsCaches) {
	t.Helper()
	dyn := fakeDynamic()
	for _, sb := range sandboxes {
		_, err := dyn.Resource(SandboxResource()).Namespace("ns").Create(context.Background(), sb, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	k, err := NewKube(fake.NewClientset(), dyn, []string{"ns"}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = k.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	require.True(t, k.WaitForSync(waitCtx))
	c := k.ns["ns"]
	require.Len(t, c.boxes.GetStore().ListKeys(), len(sandboxes))
	return k, c
}

// TestKubeResolverEventOrder drives the handlers directly: what the informers would deliver,
// in the orders that matter for a reused address.
func TestKubeResolverEventOrder(t *testing.T) {
	k, c := startKube(t, fakeSandbox("old", "u-old", "10.0.0.7"), fakeSandbox("new", "u-new", "10.0.0.7"))
	ip := netip.MustParseAddr("10.0.0.7")

	oldPod, newPod := fakePod("old-pod", "old", "u-old", "10.0.0.7"), fakePod("new-pod", "new", "u-new", "10.0.0.7")
	oldPod.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	newPod.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	k.podChanged(oldPod, c)
	assert.Equal(t, "old", k.Resolve(ip).Sandbox)

	t.Run("the new pod takes the address even before the old pod's delete arrives", func(t *testing.T) {
		k.podChanged(newPod, c)
		assert.Equal(t, "new", k.Resolve(ip).Sandbox)
	})
	t.Run("a late update of the old pod does not take the address back", func(t *testing.T) {
		k.podChanged(oldPod, c)
		assert.Equal(t, "new", k.Resolve(ip).Sandbox)
	})
	t.Run("the old pod's late delete leaves the new mapping alone", func(t *testing.T) {
		k.podDeleted(oldPod)
		assert.Equal(t, "new", k.Resolve(ip).Sandbox)
	})
	t.Run("a terminating pod stops mapping at once", func(t *testing.T) {
		terminating := newPod.DeepCopy()
		now := metav1.Now()
		terminating.DeletionTimestamp = &now
		k.podChanged(terminating, c)
		assert.False(t, k.Resolve(ip).Known)
	})
	t.Run("a pod owned by a Sandbox of another UID is an unknown caller, and the event says why", func(t *testing.T) {
		k.podChanged(fakePod("forged", "old", "u-other", "10.0.0.8"), c)
		id := k.Resolve(netip.MustParseAddr("10.0.0.8"))
		assert.False(t, id.Known)
		assert.Equal(t, "identity_unverified:sandbox", id.Unverified)
		assert.Equal(t, "10.0.0.8", id.SourceIP)
		assert.Equal(t, "anonymous", id.Key())
	})
	t.Run("a pod without the sandbox label is anonymous", func(t *testing.T) {
		p := fakePod("plain", "old", "u-old", "10.0.0.9")
		p.Labels = nil
		k.podChanged(p, c)
		assert.False(t, k.Resolve(netip.MustParseAddr("10.0.0.9")).Known)
	})
}

// TestKubeNewestPodWins delivers the add and delete events of three pods that share an address
// in every order an informer could (each pod's add before its delete), and checks after every
// event that the address belongs to the newest live pod: creation time first, then UID for pods
// created in the same second.
func TestKubeNewestPodWins(t *testing.T) {
	k, c := startKube(t, fakeSandbox("a", "u-a", "10.0.0.7"), fakeSandbox("b", "u-b", "10.0.0.7"), fakeSandbox("c", "u-c", "10.0.0.7"))
	ip := netip.MustParseAddr("10.0.0.7")
	pods := map[string]*corev1.Pod{
		"a": fakePod("a-pod", "a", "u-a", ip.String()),
		"b": fakePod("b-pod", "b", "u-b", ip.String()),
		"c": fakePod("c-pod", "c", "u-c", ip.String()),
	}
	pods["a"].CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	pods["b"].CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	pods["c"].CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	pods["b"].UID, pods["c"].UID = "uid-1", "uid-2" // same second: the greater UID is newer
	rank := map[string]int{"a": 0, "b": 1, "c": 2}

	type event struct {
		pod string
		del bool
	}
	var all []event
	for _, p := range []string{"a", "b", "c"} {
		all = append(all, event{p, false}, event{p, true})
	}
	orders := 0
	var permute func(done []event, left []event)
	permute = func(done []event, left []event) {
		if len(left) == 0 {
			orders++
			k.mu.Lock()
			k.byIP, k.holders, k.podIPs = map[netip.Addr]ipEntry{}, map[netip.Addr]map[string]ipEntry{}, map[string][]netip.Addr{}
			k.mu.Unlock()
			live := map[string]bool{}
			for i, e := range done {
				if e.del {
					k.podDeleted(pods[e.pod])
					delete(live, e.pod)
				} else {
					k.podChanged(pods[e.pod], c)
					live[e.pod] = true
				}
				want := ""
				for p := range live {
					if want == "" || rank[p] > rank[want] {
						want = p
					}
				}
				got := k.Resolve(ip)
				if !assert.Equal(t, want, got.Sandbox, "order %v, after event %d", done, i) {
					return
				}
				assert.Equal(t, want != "", got.Known)
			}
			return
		}
		for i, e := range left {
			if e.del && slices.Contains(left, event{e.pod, false}) {
				continue // a pod's delete never comes before its add
			}
			rest := append(append([]event{}, left[:i]...), left[i+1:]...)
			permute(append(append([]event{}, done...), e), rest)
		}
	}
	permute(nil, all)
	assert.Equal(t, 90, orders, "6!/2^3 orders of three add/delete pairs")
}

func BenchmarkKubeResolve(b *testing.B) {
	k := &Kube{byIP: map[netip.Addr]ipEntry{}}
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		k.byIP[a] = ipEntry{pod: "p", id: identity.Identity{Sandbox: "s", Known: true}}
	}
	ip := netip.MustParseAddr("10.1.3.4")
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = k.Resolve(ip)
		}
	})
}

// TestKubeSandboxGone checks that a deleted Sandbox is reported by its key, for the state kept
// per sandbox (grants).
func TestKubeSandboxGone(t *testing.T) {
	dyn := fakeDynamic()
	_, err := dyn.Resource(SandboxResource()).Namespace("ns").Create(context.Background(), fakeSandbox("box", "u-box"), metav1.CreateOptions{})
	require.NoError(t, err)
	k, err := NewKube(fake.NewClientset(), dyn, []string{"ns"}, nil)
	require.NoError(t, err)
	gone := make(chan string, 1)
	k.OnSandboxGone(func(key string) { gone <- key })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = k.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	require.True(t, k.WaitForSync(waitCtx))

	require.NoError(t, dyn.Resource(SandboxResource()).Namespace("ns").Delete(context.Background(), "box", metav1.DeleteOptions{}))
	select {
	case key := <-gone:
		assert.Equal(t, "ns/box", key)
	case <-time.After(10 * time.Second):
		t.Fatal("the deleted sandbox was not reported")
	}
}

// TestKubeClaimGone checks that a deleted SandboxClaim is reported, for grants kept per claim.
func TestKubeClaimGone(t *testing.T) {
	dyn := fakeDynamic()
	claim := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": "task-2", "namespace": "ns", "uid": "u-claim"}}}
	_, err := dyn.Resource(SandboxClaimResource()).Namespace("ns").Create(context.Background(), claim, metav1.CreateOptions{})
	require.NoError(t, err)
	k, err := NewKube(fake.NewClientset(), dyn, []string{"ns"}, nil)
	require.NoError(t, err)
	gone := make(chan string, 1)
	k.OnClaimGone(func(key string) { gone <- key })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = k.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	require.True(t, k.WaitForSync(waitCtx))

	require.NoError(t, dyn.Resource(SandboxClaimResource()).Namespace("ns").Delete(context.Background(), "task-2", metav1.DeleteOptions{}))
	select {
	case key := <-gone:
		assert.Equal(t, "ns/task-2", key)
	case <-time.After(10 * time.Second):
		t.Fatal("the deleted claim was not reported")
	}
}
