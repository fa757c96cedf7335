package identity

import (
	"context"
	"net/netip"
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
)

func fakeSandbox(name, uid, template string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": uid}}}
	if template != "" {
		u.SetAnnotations(map[string]string{AnnotationTemplateRef: template})
	}
	return u
}

func fakePod(name, sandbox, uid, ip string) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{LabelSandboxNameHash: "x"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: sandbox, UID: types.UID(uid), Controller: &yes}}},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

// TestKubeResolverEventOrder drives the handlers directly: what the informers would deliver,
// in the orders that matter for a reused address.
func TestKubeResolverEventOrder(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{SandboxResource(): "SandboxList"})
	// Created through the resource, not the constructor: the fake would guess "sandboxs".
	for _, sb := range []*unstructured.Unstructured{fakeSandbox("old", "u-old", "t1"), fakeSandbox("new", "u-new", "t2")} {
		_, err := dyn.Resource(SandboxResource()).Namespace("ns").Create(context.Background(), sb, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	k, err := NewKube(fake.NewClientset(), dyn, []string{"ns"}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = k.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	require.True(t, k.WaitForSync(waitCtx))
	boxes := k.boxes[0]
	require.Len(t, boxes.GetStore().ListKeys(), 2)
	ip := netip.MustParseAddr("10.0.0.7")

	oldPod, newPod := fakePod("old-pod", "old", "u-old", "10.0.0.7"), fakePod("new-pod", "new", "u-new", "10.0.0.7")
	k.podChanged(oldPod, boxes)
	assert.Equal(t, "old", k.Resolve(ip).Sandbox)

	t.Run("the new pod takes the address even before the old pod's delete arrives", func(t *testing.T) {
		k.podChanged(newPod, boxes)
		assert.Equal(t, "new", k.Resolve(ip).Sandbox)
		assert.Equal(t, "t2", k.Resolve(ip).Template)
	})
	t.Run("the old pod's late delete leaves the new mapping alone", func(t *testing.T) {
		k.podDeleted(oldPod)
		assert.Equal(t, "new", k.Resolve(ip).Sandbox)
	})
	t.Run("a terminating pod stops mapping at once", func(t *testing.T) {
		terminating := newPod.DeepCopy()
		now := metav1.Now()
		terminating.DeletionTimestamp = &now
		k.podChanged(terminating, boxes)
		assert.False(t, k.Resolve(ip).Known)
	})
	t.Run("a pod owned by a Sandbox of another UID is anonymous", func(t *testing.T) {
		k.podChanged(fakePod("forged", "old", "u-other", "10.0.0.8"), boxes)
		assert.False(t, k.Resolve(netip.MustParseAddr("10.0.0.8")).Known)
	})
	t.Run("a pod without the sandbox label is anonymous", func(t *testing.T) {
		p := fakePod("plain", "old", "u-old", "10.0.0.9")
		p.Labels = nil
		k.podChanged(p, boxes)
		assert.False(t, k.Resolve(netip.MustParseAddr("10.0.0.9")).Known)
	})
}

func BenchmarkKubeResolve(b *testing.B) {
	k := &Kube{byIP: map[netip.Addr]ipEntry{}, podIPs: map[string][]netip.Addr{}}
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		k.byIP[a] = ipEntry{pod: "p", id: Identity{Sandbox: "s", Known: true}}
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
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{SandboxResource(): "SandboxList"})
	_, err := dyn.Resource(SandboxResource()).Namespace("ns").Create(context.Background(), fakeSandbox("box", "u-box", "t1"), metav1.CreateOptions{})
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
