package identity

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The Agent Sandbox vocabulary the Kubernetes resolver reads. Package kube re-exports it.
const (
	// LabelSandboxNameHash is on every sandbox pod; only pods carrying it are watched.
	LabelSandboxNameHash = "agents.x-k8s.io/sandbox-name-hash"
	// AnnotationTemplateRef on a Sandbox names the SandboxTemplate it was created from.
	AnnotationTemplateRef = "agents.x-k8s.io/sandbox-template-ref"
	// LabelTemplateRefHash is on the pods of sandboxes created from a template: TemplateRefHash
	// of the template name.
	LabelTemplateRefHash = "agents.x-k8s.io/sandbox-template-ref-hash"
	// SandboxGroup is the API group of Sandbox; SandboxClaimGroup that of SandboxClaim.
	SandboxGroup      = "agents.x-k8s.io"
	SandboxClaimGroup = "extensions.agents.x-k8s.io"
)

// TemplateRefHash is the value of LabelTemplateRefHash for a template name: FNV-1a 32-bit,
// eight lowercase hex digits, as the Agent Sandbox controller computes it (NameHash).
func TemplateRefHash(template string) string {
	h := fnv.New32a()
	h.Write([]byte(template))
	return fmt.Sprintf("%08x", h.Sum32())
}

// SandboxResource is the Sandbox resource (agents.x-k8s.io/v1beta1).
func SandboxResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: SandboxGroup, Version: "v1beta1", Resource: "sandboxes"}
}

// podsBySandbox indexes pods by "namespace/sandbox" of their controlling Sandbox.
const podsBySandbox = "sandbox"

// Kube resolves pod IPs to sandboxes from informer caches of the configured namespaces.
//
// A pod maps only while it is live: it carries LabelSandboxNameHash, is controlled by a Sandbox
// that exists with the UID of the ownerReference, is not being deleted and has not finished. A
// deleted pod stops mapping as soon as its delete event arrives; an IP reassigned to a new pod
// maps to the new pod only, whatever order the events of the two pods arrive in. Resolve is a
// read-locked map lookup and never calls the API.
type Kube struct {
	logger *slog.Logger
	pods   []cache.SharedIndexInformer
	boxes  []cache.SharedIndexInformer
	synced []cache.InformerSynced
	start  []func(stop <-chan struct{})
	stop   []func()

	// update serialises the event handlers of all informers, so that an identity computed
	// from the caches is never stored after a newer event has removed it.
	update sync.Mutex
	// gone are called with the key ("namespace/sandbox") of each deleted Sandbox.
	gone   []func(key string)
	mu     sync.RWMutex // guards byIP and podIPs for Resolve
	byIP   map[netip.Addr]ipEntry
	podIPs map[string][]netip.Addr // pod key → addresses it is mapped under
}

type ipEntry struct {
	pod string
	id  Identity
}

// NewKube builds a resolver watching sandbox pods and Sandboxes in namespaces. Call Run to
// start it; Ready reports when its caches are filled. It needs get/list/watch on pods and
// sandboxes.agents.x-k8s.io in those namespaces (kube.RBACRules lists them).
func NewKube(client kubernetes.Interface, dyn dynamic.Interface, namespaces []string, logger *slog.Logger) (*Kube, error) {
	if len(namespaces) == 0 {
		return nil, fmt.Errorf("kubernetes identity: no namespace to watch")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	k := &Kube{logger: logger, byIP: map[netip.Addr]ipEntry{}, podIPs: map[string][]netip.Addr{}}
	for _, ns := range namespaces {
		pf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSandboxNameHash }))
		pods := pf.Core().V1().Pods().Informer()
		if err := pods.AddIndexers(cache.Indexers{podsBySandbox: indexPodBySandbox}); err != nil {
			return nil, fmt.Errorf("kubernetes identity: index pods: %w", err)
		}
		bf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
		boxes := bf.ForResource(SandboxResource()).Informer()
		k.pods = append(k.pods, pods)
		k.boxes = append(k.boxes, boxes)
		k.start = append(k.start, pf.Start, bf.Start)
		k.stop = append(k.stop, pf.Shutdown, bf.Shutdown)
	}
	for i := range k.pods {
		boxes := k.boxes[i]
		reg, err := k.pods[i].AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.podChanged(obj, boxes) },
			UpdateFunc: func(_, obj any) { k.podChanged(obj, boxes) },
			DeleteFunc: k.podDeleted,
		})
		if err != nil {
			return nil, fmt.Errorf("kubernetes identity: watch pods: %w", err)
		}
		pods := k.pods[i]
		breg, err := boxes.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.sandboxChanged(obj, pods, boxes) },
			UpdateFunc: func(_, obj any) { k.sandboxChanged(obj, pods, boxes) },
			DeleteFunc: func(obj any) {
				k.sandboxChanged(obj, pods, boxes)
				k.sandboxGone(obj)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("kubernetes identity: watch sandboxes: %w", err)
		}
		k.synced = append(k.synced, reg.HasSynced, breg.HasSynced)
	}
	return k, nil
}

// OnSandboxGone registers f to be called with the key ("namespace/sandbox", as Identity.Key) of
// every Sandbox that is deleted, for state kept per sandbox (grants). Register before Run. f runs
// on the informer's goroutine and should return quickly; every replica calls it, so it must be
// idempotent.
func (k *Kube) OnSandboxGone(f func(key string)) { k.gone = append(k.gone, f) }

func (k *Kube) sandboxGone(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	sb, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	for _, f := range k.gone {
		f(sb.GetNamespace() + "/" + sb.GetName())
	}
}

// Run starts the informers and blocks until ctx is done, then stops them.
func (k *Kube) Run(ctx context.Context) error {
	for _, start := range k.start {
		start(ctx.Done())
	}
	<-ctx.Done()
	for _, stop := range k.stop {
		stop()
	}
	return nil
}

// HasSynced reports whether every cache has been filled and handled once. Until then an
// address of a live sandbox may still resolve to anonymous.
func (k *Kube) HasSynced() bool {
	for _, s := range k.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Ready is HasSynced, for /readyz.
func (k *Kube) Ready() bool { return k.HasSynced() }

// WaitForSync blocks until HasSynced or ctx is done; it returns false on timeout.
func (k *Kube) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), k.synced...)
}

// Resolve returns the sandbox that owns addr, or Anonymous(addr). The returned Labels map is
// shared with the cache and must not be modified.
func (k *Kube) Resolve(addr netip.Addr) Identity {
	addr = addr.Unmap().WithZone("")
	k.mu.RLock()
	e, ok := k.byIP[addr]
	k.mu.RUnlock()
	if !ok {
		return Anonymous(addr)
	}
	return e.id
}

func (k *Kube) podChanged(obj any, boxes cache.SharedIndexInformer) {
	k.update.Lock()
	defer k.update.Unlock()
	k.applyPod(obj, boxes)
}

func (k *Kube) applyPod(obj any, boxes cache.SharedIndexInformer) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	id, ips, live := k.identityOf(pod, boxes)
	if !live {
		k.forget(key)
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	keep := map[netip.Addr]bool{}
	for _, ip := range ips {
		keep[ip] = true
	}
	for _, old := range k.podIPs[key] {
		if !keep[old] && k.byIP[old].pod == key {
			delete(k.byIP, old)
		}
	}
	for _, ip := range ips {
		if prev, taken := k.byIP[ip]; taken && prev.pod != key {
			k.logger.Debug("pod IP moved to another pod", "ip", ip, "from", prev.pod, "to", key)
		}
		e := ipEntry{pod: key, id: id}
		e.id.SourceIP = ip.String()
		k.byIP[ip] = e
	}
	k.podIPs[key] = ips
}

func (k *Kube) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		k.update.Lock()
		defer k.update.Unlock()
		k.forget(pod.Namespace + "/" + pod.Name)
	}
}

// forget removes a pod's addresses, except those already taken over by another pod.
func (k *Kube) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ip := range k.podIPs[key] {
		if k.byIP[ip].pod == key {
			delete(k.byIP, ip)
		}
	}
	delete(k.podIPs, key)
}

// sandboxChanged re-resolves the pods of a Sandbox whose annotations or owners may have changed
// (or that appeared after its pods, or went away).
func (k *Kube) sandboxChanged(obj any, pods, boxes cache.SharedIndexInformer) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	sb, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	objs, err := pods.GetIndexer().ByIndex(podsBySandbox, sb.GetNamespace()+"/"+sb.GetName())
	if err != nil {
		k.logger.Warn("kubernetes identity: look up pods of sandbox", "sandbox", sb.GetNamespace()+"/"+sb.GetName(), "error", err)
		return
	}
	k.update.Lock()
	defer k.update.Unlock()
	for _, o := range objs {
		k.applyPod(o, boxes)
	}
}

// identityOf returns the identity of a live sandbox pod and its addresses.
func (k *Kube) identityOf(pod *corev1.Pod, boxes cache.SharedIndexInformer) (Identity, []netip.Addr, bool) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Identity{}, nil, false
	}
	if _, ok := pod.Labels[LabelSandboxNameHash]; !ok {
		return Identity{}, nil, false
	}
	owner := sandboxOwner(pod)
	if owner == nil {
		return Identity{}, nil, false
	}
	obj, exists, err := boxes.GetStore().GetByKey(pod.Namespace + "/" + owner.Name)
	if err != nil || !exists {
		return Identity{}, nil, false
	}
	sb, ok := obj.(*unstructured.Unstructured)
	if !ok || sb.GetUID() != owner.UID || sb.GetDeletionTimestamp() != nil {
		return Identity{}, nil, false
	}
	ips := podAddrs(pod)
	if len(ips) == 0 {
		return Identity{}, nil, false
	}
	id := Identity{
		Namespace: pod.Namespace,
		Sandbox:   sb.GetName(),
		Template:  sb.GetAnnotations()[AnnotationTemplateRef],
		Claim:     claimOf(sb),
		Labels:    maps.Clone(pod.Labels),
		Known:     true,
	}
	return id, ips, true
}

func sandboxOwner(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "Sandbox" || groupOf(ref.APIVersion) != SandboxGroup {
		return nil
	}
	return ref
}

func claimOf(sb *unstructured.Unstructured) string {
	for _, ref := range sb.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "SandboxClaim" && groupOf(ref.APIVersion) == SandboxClaimGroup {
			return ref.Name
		}
	}
	return ""
}

func groupOf(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

// podAddrs returns status.podIPs (or status.podIP on old objects), unmapped, deduplicated.
func podAddrs(pod *corev1.Pod) []netip.Addr {
	raw := make([]string, 0, len(pod.Status.PodIPs)+1)
	for _, ip := range pod.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	if len(raw) == 0 && pod.Status.PodIP != "" {
		raw = append(raw, pod.Status.PodIP)
	}
	out := make([]netip.Addr, 0, len(raw))
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap().WithZone("")
		dup := false
		for _, b := range out {
			dup = dup || a == b
		}
		if !dup {
			out = append(out, a)
		}
	}
	return out
}

func indexPodBySandbox(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if ref := sandboxOwner(pod); ref != nil {
		return []string{pod.Namespace + "/" + ref.Name}, nil
	}
	return nil, nil
}
