package kubeid

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// maxPoolLabels bounds the pool label of the lifecycle metrics per namespace: past it, a new
// pool's figures go under poolOther. Pool names are chosen by whoever may create SandboxWarmPools
// (the cluster operator: sandboxes reach neither the API server nor its RBAC), and a claim's
// pool counts only once that pool exists, so a claim naming made-up pools adds no series.
const maxPoolLabels = 64

// poolOther is the pool label of a pool past maxPoolLabels, or one Sandgate has not seen.
const poolOther = "other"

// lifecycle exports the Agent Sandbox lifecycle from the informers the resolver already runs:
// how long a claim waits to be ready, how many ready sandboxes each warm pool holds, how long
// sandboxes live. Labels: sandbox_namespace (one of kubernetes.namespaces, a closed set from the
// config; not "namespace", which Prometheus's Kubernetes discovery sets to Sandgate's own) and
// pool (bounded above). All replicas export the same figures: aggregate with max, not sum.
type lifecycle struct {
	now        func() time.Time
	claimReady *prometheus.HistogramVec // sandbox_namespace, pool
	poolReady  *prometheus.GaugeVec     // sandbox_namespace, pool
	lifetime   *prometheus.HistogramVec // sandbox_namespace

	mu sync.Mutex
	// pools are the pool names labelled so far, per namespace (at most maxPoolLabels each).
	pools map[string]map[string]bool
	// pending are the claims seen created while Sandgate ran and not ready yet: key → when.
	// A claim created before Sandgate started is not measured (its wait is unknown).
	pending map[string]time.Time
}

func newLifecycle(now func() time.Time) *lifecycle {
	return &lifecycle{
		now: now,
		claimReady: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandgate_sandbox_claim_ready_seconds",
			Help:    "Time from a SandboxClaim's creation to its Ready condition, as this replica saw them, by sandbox namespace and warm pool.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"sandbox_namespace", "pool"}),
		poolReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandgate_warm_pool_ready_sandboxes",
			Help: "Ready sandboxes waiting in each SandboxWarmPool (its status.readyReplicas).",
		}, []string{"sandbox_namespace", "pool"}),
		lifetime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandgate_sandbox_lifetime_seconds",
			Help:    "Lifetime of deleted Sandboxes, creation to deletion, by sandbox namespace.",
			Buckets: []float64{10, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 3 * 24 * 3600, 7 * 24 * 3600},
		}, []string{"sandbox_namespace"}),
		pools:   map[string]map[string]bool{},
		pending: map[string]time.Time{},
	}
}

func (l *lifecycle) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.claimReady, l.poolReady, l.lifetime}
}

// handlers are the lifecycle's informer handlers: claims, warm pools, sandboxes.
func (l *lifecycle) handlers() (claims, pools, boxes cache.ResourceEventHandler) {
	claims = cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    l.claimAdded,
		UpdateFunc: func(_, obj any) { l.claimUpdated(obj) },
		DeleteFunc: func(obj any) { l.forgetClaim(obj) },
	}
	pools = cache.ResourceEventHandlerFuncs{
		AddFunc:    l.poolChanged,
		UpdateFunc: func(_, obj any) { l.poolChanged(obj) },
		DeleteFunc: l.poolDeleted,
	}
	boxes = cache.ResourceEventHandlerFuncs{DeleteFunc: l.sandboxDeleted}
	return claims, pools, boxes
}

// claimAdded starts the clock of a claim created while Sandgate runs (not one of the initial
// list, whose creation Sandgate did not see).
func (l *lifecycle) claimAdded(obj any, initialList bool) {
	cl, ok := obj.(*unstructured.Unstructured)
	if !ok || initialList || conditionTrue(cl, "Ready") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending[cl.GetNamespace()+"/"+cl.GetName()] = l.now()
}

// claimUpdated observes a pending claim that has become ready.
func (l *lifecycle) claimUpdated(obj any) {
	cl, ok := obj.(*unstructured.Unstructured)
	if !ok || !conditionTrue(cl, "Ready") {
		return
	}
	key := cl.GetNamespace() + "/" + cl.GetName()
	pool, _, _ := unstructured.NestedString(cl.Object, "spec", "warmPoolRef", "name")
	l.mu.Lock()
	defer l.mu.Unlock()
	since, ok := l.pending[key]
	if !ok {
		return
	}
	delete(l.pending, key)
	l.claimReady.WithLabelValues(cl.GetNamespace(), l.poolLabel(cl.GetNamespace(), pool, false)).
		Observe(l.now().Sub(since).Seconds())
}

func (l *lifecycle) forgetClaim(obj any) {
	if cl, ok := deleted(obj); ok {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.pending, cl.GetNamespace()+"/"+cl.GetName())
	}
}

func (l *lifecycle) poolChanged(obj any) {
	p, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	ready, _, _ := unstructured.NestedInt64(p.Object, "status", "readyReplicas")
	l.mu.Lock()
	defer l.mu.Unlock()
	if label := l.poolLabel(p.GetNamespace(), p.GetName(), true); label != poolOther {
		l.poolReady.WithLabelValues(p.GetNamespace(), label).Set(float64(ready))
	}
}

func (l *lifecycle) poolDeleted(obj any) {
	p, ok := deleted(obj)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pools[p.GetNamespace()][p.GetName()] {
		delete(l.pools[p.GetNamespace()], p.GetName())
		l.poolReady.DeleteLabelValues(p.GetNamespace(), p.GetName())
	}
}

func (l *lifecycle) sandboxDeleted(obj any) {
	sb, ok := deleted(obj)
	if !ok {
		return
	}
	if age := l.now().Sub(sb.GetCreationTimestamp().Time); age >= 0 {
		l.lifetime.WithLabelValues(sb.GetNamespace()).Observe(age.Seconds())
	}
}

// poolLabel is pool's label value in ns: its name once it is labelled, poolOther past the bound
// or for a pool not seen. add labels a pool seen in the pool informer, within the bound. l.mu
// is held.
func (l *lifecycle) poolLabel(ns, pool string, add bool) string {
	names := l.pools[ns]
	if names[pool] {
		return pool
	}
	if !add || pool == "" || pool == poolOther || len(names) >= maxPoolLabels {
		return poolOther
	}
	if names == nil {
		names = map[string]bool{}
		l.pools[ns] = names
	}
	names[pool] = true
	return pool
}

// conditionTrue reports whether obj's status.conditions has typ with status True.
func conditionTrue(obj *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return m["status"] == "True"
		}
	}
	return false
}

// deleted is the object of a delete event, also when the informer missed the deletion.
func deleted(obj any) (*unstructured.Unstructured, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}
