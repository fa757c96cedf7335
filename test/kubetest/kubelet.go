package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// AssignPodIPs plays the kubelets' part for the pods of ns, until the test ends: every live pod
// without an address gets the next of 10.N.x.y (N given, so that two namespaces of a test never
// share an address), through the status subresource as SetPodIPs writes it. Pods the Agent
// Sandbox controller creates then become sandboxes with addresses without a test naming each.
func AssignPodIPs(t testing.TB, cs kubernetes.Interface, ns string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	var mu sync.Mutex
	next := 0
	assigned := map[types.UID]bool{}
	assign := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Status.PodIP != "" || pod.DeletionTimestamp != nil {
			return
		}
		mu.Lock()
		if assigned[pod.UID] {
			mu.Unlock()
			return
		}
		assigned[pod.UID] = true
		next++
		ip := fmt.Sprintf("10.%d.%d.%d", n, next/250, next%250+1)
		mu.Unlock()
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": ip, "podIPs": []map[string]string{{"ip": ip}}}})
		if _, err := cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
			t.Errorf("kubetest: kubelet: set the address of pod %s/%s: %v", ns, pod.Name, err)
		}
	}
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: assign, UpdateFunc: func(_, obj any) { assign(obj) }}); err != nil {
		cancel()
		t.Fatalf("kubetest: kubelet: %v", err)
	}
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
}
