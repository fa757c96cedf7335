package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/sandgate/sandgate/internal/config"
)

// Drift reasons, the "reason" label of sandgate_kube_drift_total.
const (
	DriftModified = "modified" // someone changed what Sandgate applied
	DriftDeleted  = "deleted"  // someone deleted what Sandgate applied
)

// Controller keeps the rules of Render applied in the configured namespaces. It watches
// SandboxTemplates and the NetworkPolicies it owns; on every change, and every
// cfg.Controller.Resync, it reconciles the namespace: applies what is missing or different,
// reports drift (metric, Warning event, log) when what it had applied was changed or deleted,
// and deletes owned NetworkPolicies nothing asks for any more (a deleted or re-Managed template).
// Reconciling is idempotent and writes nothing when the cluster already matches.
type Controller struct {
	cfg     config.Kubernetes
	logger  *slog.Logger
	applier Applier
	client  kubernetes.Interface

	namespaces []string // sandbox namespaces, then Sandgate's if not among them
	templates  map[string]cache.SharedIndexInformer
	policies   map[string]cache.SharedIndexInformer
	synced     []cache.InformerSynced
	start      []func(<-chan struct{})
	stop       []func()
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder

	// applied remembers objects written by this process, so that their deletion is drift.
	// Only the single worker goroutine touches it.
	applied map[string]bool
	// collisions are the name collisions reported per namespace, so each is reported once
	// while it lasts. Only the worker goroutine touches it.
	collisions map[string]map[Collision]bool

	drift      *prometheus.CounterVec
	reconciles *prometheus.CounterVec
	collided   *prometheus.CounterVec
}

// NewController builds a controller for cfg (cfg.Namespaces must not be empty). reg receives
// its metrics (sandgate_kube_drift_total, sandgate_kube_reconciles_total); nil skips
// registration. It needs the Roles of RBAC(cfg, …) with cfg.Controller.Enabled.
func NewController(client kubernetes.Interface, dyn dynamic.Interface, cfg config.Kubernetes, logger *slog.Logger, reg prometheus.Registerer) (*Controller, error) {
	if len(cfg.Namespaces) == 0 {
		return nil, fmt.Errorf("kubernetes controller: kubernetes.namespaces is empty")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Controller{
		cfg: cfg, logger: logger.With("component", "kube-controller"), client: client,
		applier:    Applier{Client: client, Dynamic: dyn},
		templates:  map[string]cache.SharedIndexInformer{},
		policies:   map[string]cache.SharedIndexInformer{},
		applied:    map[string]bool{},
		collisions: map[string]map[Collision]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandgate-netpol"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_kube_drift_total",
			Help: "Objects Sandgate applied that were found changed or deleted, and re-applied.",
		}, []string{"kind", "reason"}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_kube_reconciles_total",
			Help: "Namespace reconciliations of the NetworkPolicy controller, by result.",
		}, []string{"result"}),
		collided: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_kube_name_collisions_total",
			Help: "Templates refused an object because its name was another template's, by kind of object.",
		}, []string{"kind"}),
	}
	if reg != nil {
		for _, m := range []prometheus.Collector{c.drift, c.reconciles, c.collided} {
			if err := reg.Register(m); err != nil {
				return nil, fmt.Errorf("kubernetes controller: register metrics: %w", err)
			}
		}
	}
	c.namespaces = slices.Clone(cfg.Namespaces)
	if !slices.Contains(c.namespaces, cfg.Sandgate.Namespace) {
		c.namespaces = append(c.namespaces, cfg.Sandgate.Namespace)
	}
	resync := cfg.Controller.Resync.D()
	enqueue := func(obj any) {
		if m, err := meta(obj); err == nil {
			c.queue.Add(m.GetNamespace())
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}
	for _, ns := range c.namespaces {
		pf := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedByValue }))
		np := pf.Networking().V1().NetworkPolicies().Informer()
		r, err := np.AddEventHandler(handler)
		if err != nil {
			return nil, fmt.Errorf("kubernetes controller: watch NetworkPolicies: %w", err)
		}
		c.policies[ns] = np
		c.synced = append(c.synced, r.HasSynced)
		c.start, c.stop = append(c.start, pf.Start), append(c.stop, pf.Shutdown)
		if !slices.Contains(cfg.Namespaces, ns) {
			continue
		}
		tf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, resync, ns, nil)
		ti := tf.ForResource(SandboxTemplateGVR).Informer()
		r, err = ti.AddEventHandler(handler)
		if err != nil {
			return nil, fmt.Errorf("kubernetes controller: watch SandboxTemplates: %w", err)
		}
		c.templates[ns] = ti
		c.synced = append(c.synced, r.HasSynced)
		c.start, c.stop = append(c.start, tf.Start), append(c.stop, tf.Shutdown)
	}
	return c, nil
}

// HasSynced reports whether the controller's caches are filled.
func (c *Controller) HasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Run starts the informers and the worker and blocks until ctx is done. It returns an error
// only when the caches cannot be filled before ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	c.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "sandgate"})
	defer broadcaster.Shutdown()
	defer c.queue.ShutDown()
	for _, start := range c.start {
		start(ctx.Done())
	}
	defer func() {
		for _, stop := range c.stop {
			stop()
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kubernetes controller: caches did not sync")
	}
	c.logger.Info("NetworkPolicy controller started", "namespaces", c.cfg.Namespaces, "sandgate_namespace", c.cfg.Sandgate.Namespace)
	go c.resyncLoop(ctx)
	go func() { <-ctx.Done(); c.queue.ShutDown() }()
	for c.processNext(ctx) {
	}
	return nil
}

func (c *Controller) resyncLoop(ctx context.Context) {
	for _, ns := range c.namespaces {
		c.queue.Add(ns)
	}
	period := c.cfg.Controller.Resync.D()
	if period <= 0 {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, ns := range c.namespaces {
				c.queue.Add(ns)
			}
		}
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	ns, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(ns)
	if err := c.reconcile(ctx, ns); err != nil {
		c.reconciles.WithLabelValues("error").Inc()
		if ctx.Err() == nil {
			c.logger.Warn("reconcile failed; retrying", "namespace", ns, "error", err)
		}
		c.queue.AddRateLimited(ns)
		return true
	}
	c.reconciles.WithLabelValues("ok").Inc()
	c.queue.Forget(ns)
	return true
}

// reconcile brings one namespace to the desired state.
func (c *Controller) reconcile(ctx context.Context, ns string) error {
	var desired Desired
	if ti, ok := c.templates[ns]; ok {
		var templates []Template
		for _, obj := range ti.GetStore().List() {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			t, err := TemplateFromUnstructured(u)
			if err != nil {
				c.logger.Warn("skipping SandboxTemplate", "error", err)
				continue
			}
			templates = append(templates, t)
		}
		desired = RenderNamespace(c.cfg, ns, templates)
	}
	if ns == c.cfg.Sandgate.Namespace {
		desired.NetworkPolicies = append(desired.NetworkPolicies, SandgateIngress(c.cfg))
	}

	taken, err := c.reconcilePolicies(ctx, ns, desired)
	if err != nil {
		return err
	}
	c.noteCollisions(ns, append(desired.Collisions, taken...))
	return c.reconcileTemplates(ctx, ns, desired)
}

// reconcilePolicies applies the namespace's desired NetworkPolicies that differ from what is
// observed (reporting drift) and deletes the ones Sandgate manages that no rule asks for. A
// policy whose name is held by another template's policy is not written: it is returned as a
// collision, so two templates never take turns at one name.
func (c *Controller) reconcilePolicies(ctx context.Context, ns string, desired Desired) ([]Collision, error) {
	store := c.policies[ns].GetStore()
	want := map[string]bool{}
	var taken []Collision
	for _, np := range desired.NetworkPolicies {
		want[np.Name] = true
		key := "NetworkPolicy/" + ns + "/" + np.Name
		observed, err := c.observedPolicy(ctx, store, np)
		if err != nil {
			return nil, err
		}
		if h := holderOf(observed); h != "" && h != np.Annotations[AnnotationTemplate] {
			taken = append(taken, Collision{Kind: "NetworkPolicy", Namespace: ns, Name: np.Name, Template: np.Annotations[AnnotationTemplate], Holder: h})
			continue
		}
		switch {
		case observed == nil && c.applied[key]:
			c.reportDrift(np, "NetworkPolicy", DriftDeleted, ns+"/"+np.Name)
		case observed == nil:
		case policyMatches(observed, np):
			c.applied[key] = true
			continue
		default:
			c.reportDrift(observed, "NetworkPolicy", DriftModified, ns+"/"+np.Name)
		}
		if err := c.applier.ApplyNetworkPolicy(ctx, np); err != nil {
			return nil, err
		}
		c.applied[key] = true
		c.logger.Info("applied NetworkPolicy", "namespace", ns, "name", np.Name)
	}
	for _, obj := range store.List() {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok || want[np.Name] || np.Labels[LabelManagedBy] != ManagedByValue {
			continue
		}
		if err := c.applier.DeleteNetworkPolicy(ctx, ns, np.Name); err != nil {
			return nil, err
		}
		delete(c.applied, "NetworkPolicy/"+ns+"/"+np.Name)
		c.logger.Info("deleted NetworkPolicy no rule asks for", "namespace", ns, "name", np.Name, "template", np.Annotations[AnnotationTemplate])
	}
	return taken, nil
}

// holderOf is the template a stored per-template NetworkPolicy belongs to ("" for none).
func holderOf(np *networkingv1.NetworkPolicy) string {
	if np == nil {
		return ""
	}
	return np.Annotations[AnnotationTemplate]
}

// noteCollisions reports each new collision of ns once (metric, log, Warning event on the
// refused template) and forgets the ones that are gone. The refused template keeps only the
// namespace's deny-all: its sandboxes reach nothing until one of the two is renamed.
func (c *Controller) noteCollisions(ns string, now []Collision) {
	seen := map[Collision]bool{}
	for _, col := range now {
		seen[col] = true
		if c.collisions[ns][col] {
			continue
		}
		c.collided.WithLabelValues(col.Kind).Inc()
		c.logger.Warn("refused a template: the name of its object is another template's",
			"kind", col.Kind, "namespace", ns, "name", col.Name, "template", col.Template, "holder", col.Holder)
		if obj, ok, _ := c.templates[ns].GetStore().GetByKey(ns + "/" + col.Template); ok && c.recorder != nil {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				c.recorder.Eventf(u, corev1.EventTypeWarning, "SandgateNameCollision",
					"%s %s/%s is already template %s's: this template gets none, and its sandboxes reach nothing; rename one of the two",
					col.Kind, ns, col.Name, col.Holder)
			}
		}
	}
	c.collisions[ns] = seen
}

// reconcileTemplates writes Sandgate's rules into the SandboxTemplates whose
// spec.networkPolicy differs, deciding on the live object, not the cache.
func (c *Controller) reconcileTemplates(ctx context.Context, ns string, desired Desired) error {
	for _, ta := range desired.Templates {
		obj, exists, err := c.templates[ns].GetStore().GetByKey(ns + "/" + ta.Name)
		if err != nil || !exists {
			continue // deleted since the list above; its delete event brings us back
		}
		u := obj.(*unstructured.Unstructured)
		if templateMatches(u, ta) {
			continue
		}
		// The cache may lag behind our own last write: only the live object decides.
		u, err = c.applier.Dynamic.Resource(SandboxTemplateGVR).Namespace(ns).Get(ctx, ta.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return fmt.Errorf("get SandboxTemplate %s/%s: %w", ns, ta.Name, err)
		}
		if templateMatches(u, ta) {
			continue
		}
		if appliedBefore(u) {
			c.reportDrift(u, "SandboxTemplate", DriftModified, ns+"/"+ta.Name+" spec.networkPolicy")
		}
		if err := c.applier.ApplyTemplate(ctx, ta); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		c.logger.Info("applied SandboxTemplate spec.networkPolicy", "namespace", ns, "name", ta.Name)
	}
	return nil
}

func (c *Controller) reportDrift(obj runtime.Object, kind, reason, what string) {
	c.drift.WithLabelValues(kind, reason).Inc()
	c.logger.Warn("drift: re-applying what Sandgate owns", "kind", kind, "object", what, "reason", reason)
	if c.recorder != nil {
		c.recorder.Eventf(obj, corev1.EventTypeWarning, "SandgateDrift", "%s %s was %s outside Sandgate; re-applied", kind, what, reason)
	}
}

// observedPolicy returns the current state of desired's NetworkPolicy, nil when absent. The
// cache answers when it agrees with desired; otherwise, since the cache may lag behind
// Sandgate's own last write, a live read decides (so drift is never reported for our own write).
func (c *Controller) observedPolicy(ctx context.Context, store cache.Store, desired *networkingv1.NetworkPolicy) (*networkingv1.NetworkPolicy, error) {
	obj, exists, err := store.GetByKey(desired.Namespace + "/" + desired.Name)
	if err != nil {
		return nil, fmt.Errorf("read NetworkPolicy %s/%s from cache: %w", desired.Namespace, desired.Name, err)
	}
	if exists {
		if np, ok := obj.(*networkingv1.NetworkPolicy); ok && policyMatches(np, desired) {
			return np, nil
		}
	}
	live, err := c.client.NetworkingV1().NetworkPolicies(desired.Namespace).Get(ctx, desired.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get NetworkPolicy %s/%s: %w", desired.Namespace, desired.Name, err)
	}
	return live, nil
}

// templateMatches reports whether the template's spec.networkPolicy is the desired one.
func templateMatches(u *unstructured.Unstructured, desired TemplateApply) bool {
	current, err := TemplateFromUnstructured(u)
	return err == nil && current.NetworkPolicy != nil && equality.Semantic.DeepEqual(*current.NetworkPolicy, desired.Spec)
}

// policyMatches reports whether the observed policy carries the desired spec, labels and
// annotations (other labels and annotations may be added by others).
func policyMatches(observed, desired *networkingv1.NetworkPolicy) bool {
	for k, v := range desired.Labels {
		if observed.Labels[k] != v {
			return false
		}
	}
	for k, v := range desired.Annotations {
		if observed.Annotations[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(observed.Spec, desired.Spec)
}

// appliedBefore reports whether Sandgate's field manager already owns fields of obj.
func appliedBefore(obj metav1.Object) bool {
	for _, mf := range obj.GetManagedFields() {
		if mf.Manager == FieldManager {
			return true
		}
	}
	return false
}

func meta(obj any) (metav1.Object, error) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("not an object: %T", obj)
	}
	return m, nil
}
