package kubeid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sandgate/sandgate/internal/identity"
)

// SandboxResource is the Sandbox resource (agents.x-k8s.io/v1beta1).
func SandboxResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: identity.SandboxGroup, Version: "v1beta1", Resource: "sandboxes"}
}

// SandboxClaimResource and SandboxWarmPoolResource are the extension resources that control
// Sandboxes (extensions.agents.x-k8s.io/v1beta1).
func SandboxClaimResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: identity.SandboxClaimGroup, Version: "v1beta1", Resource: "sandboxclaims"}
}

// SandboxWarmPoolResource: see SandboxClaimResource.
func SandboxWarmPoolResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: identity.SandboxClaimGroup, Version: "v1beta1", Resource: "sandboxwarmpools"}
}

// podsBySandbox indexes pods by "namespace/sandbox" of their controlling Sandbox.
const podsBySandbox = "sandbox"

// Kube resolves pod IPs to sandboxes from informer caches of the configured namespaces.
//
// A pod is a candidate while it is live: it carries LabelSandboxNameHash, is not being deleted
// and has not finished. Its identity is then verified link by link (verify, in chain.go); a
// pod whose chain does not hold keeps its addresses, as an unknown caller whose Unverified
// names the link, and (unless it is a state the controller passes through) is logged and
// counted in sandgate_identity_unverified_total{link}. A deleted pod stops mapping as soon as
// its delete event arrives. An address claimed by several live pods belongs to the newest
// (creation time, then UID), verified or not, whatever order their events arrive in. Resolve is
// a read-locked map lookup and never calls the API.
type Kube struct {
	logger *slog.Logger
	ns     map[string]*nsCaches
	synced []cache.InformerSynced
	start  []func(stop <-chan struct{})
	stop   []func()

	unverified *prometheus.CounterVec
	lifecycle  *lifecycle

	// update serialises the event handlers of all informers, so that an identity computed
	// from the caches is never stored after a newer event has removed it.
	update sync.Mutex
	// refused is the last refusal logged per pod key, so a pod is logged once per change.
	refused map[string]Link
	// gone are called with the key ("namespace/sandbox") of each deleted Sandbox.
	gone []func(key string)
	// goneClaim are called with "namespace/claim" of each deleted SandboxClaim.
	goneClaim []func(key string)

	mu      sync.RWMutex // guards byIP, holders and podIPs
	byIP    map[netip.Addr]ipEntry
	holders map[netip.Addr]map[string]ipEntry // every live pod that has the address
	podIPs  map[string][]netip.Addr           // pod key → addresses it holds
}

// nsCaches are the informers of one namespace.
type nsCaches struct {
	pods, boxes, claims, pools cache.SharedIndexInformer
}

func (c *nsCaches) sandbox(ns, name string) *unstructured.Unstructured { return get(c.boxes, ns, name) }
func (c *nsCaches) claim(ns, name string) *unstructured.Unstructured   { return get(c.claims, ns, name) }
func (c *nsCaches) warmPool(ns, name string) *unstructured.Unstructured {
	return get(c.pools, ns, name)
}

func get(inf cache.SharedIndexInformer, ns, name string) *unstructured.Unstructured {
	if name == "" {
		return nil
	}
	obj, ok, err := inf.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

type ipEntry struct {
	pod     string
	created metav1.Time
	uid     types.UID
	id      identity.Identity
}

// newer reports whether a is the newer pod of two that claim one address: later creation
// time, then the greater UID (a total order every replica agrees on).
func (a ipEntry) newer(b ipEntry) bool {
	if !a.created.Equal(&b.created) {
		return b.created.Before(&a.created)
	}
	return a.uid > b.uid
}

// KubeOption configures NewKube.
type KubeOption func(*Kube)

// WithRegisterer registers the resolver's metrics with reg.
func WithRegisterer(reg prometheus.Registerer) KubeOption {
	return func(k *Kube) {
		if reg != nil {
			reg.MustRegister(append(k.lifecycle.collectors(), k.unverified)...)
		}
	}
}

// NewKube builds a resolver watching sandbox pods, Sandboxes, SandboxClaims and
// SandboxWarmPools in namespaces. Call Run to start it; Ready reports when its caches are
// filled. It needs list/watch on those resources in those namespaces (kube.RBACRules lists them).
func NewKube(client kubernetes.Interface, dyn dynamic.Interface, namespaces []string, logger *slog.Logger, opts ...KubeOption) (*Kube, error) {
	if len(namespaces) == 0 {
		return nil, fmt.Errorf("kubernetes identity: no namespace to watch")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	k := &Kube{logger: logger, ns: map[string]*nsCaches{}, refused: map[string]Link{},
		byIP: map[netip.Addr]ipEntry{}, holders: map[netip.Addr]map[string]ipEntry{}, podIPs: map[string][]netip.Addr{},
		unverified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_identity_unverified_total",
			Help: "Sandbox pods resolved as unknown callers, by the link of their identity chain that did not hold.",
		}, []string{"link"}),
		lifecycle: newLifecycle(time.Now),
	}
	for _, o := range opts {
		o(k)
	}
	for _, ns := range namespaces {
		pf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = identity.LabelSandboxNameHash }))
		c := &nsCaches{pods: pf.Core().V1().Pods().Informer()}
		if err := c.pods.AddIndexers(cache.Indexers{podsBySandbox: indexPodBySandbox}); err != nil {
			return nil, fmt.Errorf("kubernetes identity: index pods: %w", err)
		}
		bf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
		c.boxes = bf.ForResource(SandboxResource()).Informer()
		c.claims = bf.ForResource(SandboxClaimResource()).Informer()
		c.pools = bf.ForResource(SandboxWarmPoolResource()).Informer()
		k.ns[ns] = c
		k.start = append(k.start, pf.Start, bf.Start)
		k.stop = append(k.stop, pf.Shutdown, bf.Shutdown)
	}
	for _, c := range k.ns {
		if err := k.watch(c); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// watch registers the resolver's and the lifecycle metrics' handlers on c's informers.
func (k *Kube) watch(c *nsCaches) error {
	regs := make([]cache.ResourceEventHandlerRegistration, 0, 7)
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		reg, err := inf.AddEventHandler(h)
		regs = append(regs, reg)
		return err
	}
	claims, pools, boxes := k.lifecycle.handlers()
	err := errors.Join(
		add(c.pods, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.podChanged(obj, c) },
			UpdateFunc: func(_, obj any) { k.podChanged(obj, c) },
			DeleteFunc: k.podDeleted,
		}),
		add(c.boxes, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.sandboxChanged(obj, c) },
			UpdateFunc: func(_, obj any) { k.sandboxChanged(obj, c) },
			DeleteFunc: func(obj any) {
				k.sandboxChanged(obj, c)
				k.notifyGone(obj, k.gone)
			},
		}),
		add(c.claims, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.claimChanged(obj, c) },
			UpdateFunc: func(old, obj any) { k.claimChanged(old, c); k.claimChanged(obj, c) },
			DeleteFunc: func(obj any) {
				k.claimChanged(obj, c)
				k.notifyGone(obj, k.goneClaim)
			},
		}),
		add(c.pools, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { k.namespaceChanged(c) },
			UpdateFunc: func(any, any) { k.namespaceChanged(c) },
			DeleteFunc: func(any) { k.namespaceChanged(c) },
		}),
		add(c.claims, claims), add(c.pools, pools), add(c.boxes, boxes),
	)
	if err != nil {
		return fmt.Errorf("kubernetes identity: watch: %w", err)
	}
	for _, r := range regs {
		k.synced = append(k.synced, r.HasSynced)
	}
	return nil
}

// OnSandboxGone registers f to be called with the key ("namespace/sandbox", as Identity.Key) of
// every Sandbox that is deleted, for state kept per sandbox. Register before Run. f runs on the
// informer's goroutine and should return quickly; every replica calls it, so it must be
// idempotent.
func (k *Kube) OnSandboxGone(f func(key string)) { k.gone = append(k.gone, f) }

// OnClaimGone is OnSandboxGone for SandboxClaims ("namespace/claim"), for grants kept per claim.
func (k *Kube) OnClaimGone(f func(key string)) { k.goneClaim = append(k.goneClaim, f) }

func (k *Kube) notifyGone(obj any, fs []func(string)) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	for _, f := range fs {
		f(u.GetNamespace() + "/" + u.GetName())
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
func (k *Kube) Resolve(addr netip.Addr) identity.Identity {
	addr = addr.Unmap().WithZone("")
	k.mu.RLock()
	e, ok := k.byIP[addr]
	k.mu.RUnlock()
	if !ok {
		return identity.Anonymous(addr)
	}
	return e.id
}

func (k *Kube) podChanged(obj any, c *nsCaches) {
	k.update.Lock()
	defer k.update.Unlock()
	k.applyPod(obj, c)
}

func (k *Kube) applyPod(obj any, c *nsCaches) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	id, ips, live := k.identityOf(pod, c)
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
		if !keep[old] {
			k.release(old, key)
		}
	}
	for _, ip := range ips {
		e := ipEntry{pod: key, created: pod.CreationTimestamp, uid: pod.UID, id: id}
		e.id.SourceIP = ip.String()
		if k.holders[ip] == nil {
			k.holders[ip] = map[string]ipEntry{}
		}
		k.holders[ip][key] = e
		k.elect(ip)
	}
	k.podIPs[key] = ips
}

// elect gives ip to the newest pod that holds it. Called with mu held.
func (k *Kube) elect(ip netip.Addr) {
	var best ipEntry
	found := false
	for _, e := range k.holders[ip] {
		if !found || e.newer(best) {
			best, found = e, true
		}
	}
	if !found {
		delete(k.byIP, ip)
		delete(k.holders, ip)
		return
	}
	if prev, ok := k.byIP[ip]; ok && prev.pod != best.pod {
		k.logger.Debug("pod IP moved to the newest pod that has it", "ip", ip, "from", prev.pod, "to", best.pod)
	}
	k.byIP[ip] = best
}

// release drops pod key from the holders of ip. Called with mu held.
func (k *Kube) release(ip netip.Addr, key string) {
	delete(k.holders[ip], key)
	k.elect(ip)
}

func (k *Kube) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		k.update.Lock()
		defer k.update.Unlock()
		k.forget(pod.Namespace + "/" + pod.Name)
		delete(k.refused, pod.Namespace+"/"+pod.Name)
	}
}

// forget removes a pod from the holders of its addresses; each goes to the newest remaining
// holder, if any.
func (k *Kube) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ip := range k.podIPs[key] {
		k.release(ip, key)
	}
	delete(k.podIPs, key)
}

// sandboxChanged re-resolves the pods of a Sandbox whose annotations or owners may have changed
// (or that appeared after its pods, or went away).
func (k *Kube) sandboxChanged(obj any, c *nsCaches) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if sb, ok := obj.(*unstructured.Unstructured); ok {
		k.sandboxPodsChanged(sb.GetNamespace(), sb.GetName(), c)
	}
}

// claimChanged re-resolves the pods of the sandbox a claim is bound to (called with the old and
// the new object of an update, so the sandbox it no longer names is re-resolved too).
func (k *Kube) claimChanged(obj any, c *nsCaches) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	cl, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	if name, _, _ := unstructured.NestedString(cl.Object, "status", "sandbox", "name"); name != "" {
		k.sandboxPodsChanged(cl.GetNamespace(), name, c)
	}
}

func (k *Kube) sandboxPodsChanged(ns, name string, c *nsCaches) {
	objs, err := c.pods.GetIndexer().ByIndex(podsBySandbox, ns+"/"+name)
	if err != nil {
		k.logger.Warn("kubernetes identity: look up pods of sandbox", "sandbox", ns+"/"+name, "error", err)
		return
	}
	k.update.Lock()
	defer k.update.Unlock()
	for _, o := range objs {
		k.applyPod(o, c)
	}
}

// namespaceChanged re-resolves every pod of a namespace (a warm pool changed: rare).
func (k *Kube) namespaceChanged(c *nsCaches) {
	k.update.Lock()
	defer k.update.Unlock()
	for _, o := range c.pods.GetStore().List() {
		k.applyPod(o, c)
	}
}

// identityOf returns the identity of a live sandbox pod (unknown, with the failed link, when
// its chain does not hold) and its addresses; live is false for a pod that holds no address
// Sandgate should map.
func (k *Kube) identityOf(pod *corev1.Pod, c *nsCaches) (id identity.Identity, ips []netip.Addr, live bool) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return identity.Identity{}, nil, false
	}
	if _, ok := pod.Labels[identity.LabelSandboxNameHash]; !ok {
		return identity.Identity{}, nil, false
	}
	ips = podAddrs(pod)
	if len(ips) == 0 {
		return identity.Identity{}, nil, false
	}
	key := pod.Namespace + "/" + pod.Name
	v := verify(pod, ips, c)
	if v.link != Verified {
		k.report(pod, ips, v)
		return identity.Identity{Unverified: v.link.Unverified()}, ips, true
	}
	delete(k.refused, key)
	return identity.Identity{
		Namespace: pod.Namespace,
		Sandbox:   v.sandbox,
		Template:  v.template,
		Claim:     v.claim,
		Labels:    maps.Clone(pod.Labels),
		Known:     true,
	}, ips, true
}

// report logs and counts a pod whose chain did not hold, once per pod and link. A transient
// state is logged at debug level and not counted.
func (k *Kube) report(pod *corev1.Pod, ips []netip.Addr, v verdict) {
	key := pod.Namespace + "/" + pod.Name
	if k.refused[key] == v.link {
		return
	}
	k.refused[key] = v.link
	owner := ""
	if ref := sandboxOwner(pod); ref != nil {
		owner = ref.Name
	}
	if v.transient {
		k.logger.Debug("sandbox pod is an unknown caller until the controller completes its identity",
			"link", string(v.link), "pod", key, "sandbox", owner)
		return
	}
	k.unverified.WithLabelValues(string(v.link)).Inc()
	k.logger.Warn("sandbox pod is an unknown caller: a link of its identity chain does not hold",
		"unverified", v.link.Unverified(), "pod", key, "sandbox", owner, "ips", ips,
		"template_hash", pod.Labels[identity.LabelTemplateRefHash])
}

func sandboxOwner(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "Sandbox" || groupOf(ref.APIVersion) != identity.SandboxGroup {
		return nil
	}
	return ref
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
