package deploy

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// The chart's admission policy for templates' rules keeps judging by the rules of the release
// installed now, whatever became of the objects of the one before: after `helm uninstall` and
// `helm install` with other rules, after the policy is switched off and on again while its
// rules change, and after the rules' ConfigMap alone is deleted and recreated. Never the old
// rules, never every Managed template refused. Each case runs `helm` against a real apiserver
// of its own (the apiserver keeps the state a case leaves), beside Sandgate's NetworkPolicy
// controller as the chart runs it (its config, its ServiceAccount), on every Agent Sandbox
// release's CRDs. The apiserver's admission plugin stops watching a built-in parameter kind for
// good once no binding uses it (kubernetes/kubernetes#133827): what it last saw of a ConfigMap
// parameter is then all it ever sees.
func TestTemplateRulesPolicySurvivesReinstall(t *testing.T) {
	helmBin(t)
	dnsOff := "kubernetes.dns=false" // other rules: no egress to the cluster DNS
	for _, release := range kubetest.Releases() {
		t.Run(release.Version, func(t *testing.T) {
			t.Run("helm uninstall, then helm install with other rules", func(t *testing.T) {
				rig := newRulesRig(t, release)
				before := rig.helm(t, "install")
				rig.judgesBy(t, before, rig.render(t, dnsOff))
				rig.helm(t, "uninstall")
				rig.notEnforced(t)
				after := rig.helm(t, "install", dnsOff)
				rig.judgesBy(t, after, before)
			})
			t.Run("the policy switched off, then on again with other rules", func(t *testing.T) {
				rig := newRulesRig(t, release)
				before := rig.helm(t, "install")
				rig.judgesBy(t, before, rig.render(t, dnsOff))
				rig.helm(t, "upgrade", "kubernetes.admissionPolicy=false")
				rig.notEnforced(t)
				after := rig.helm(t, "upgrade", dnsOff)
				rig.judgesBy(t, after, before)
			})
			t.Run("the rules' ConfigMap deleted and recreated by helm", func(t *testing.T) {
				rig := newRulesRig(t, release)
				cfg := rig.helm(t, "install")
				rig.judgesBy(t, cfg, rig.render(t, dnsOff))
				err := rig.admin.CoreV1().ConfigMaps(rulesNamespace).Delete(rig.ctx, "sandgate-template-rules", metav1.DeleteOptions{})
				if !apierrors.IsNotFound(err) {
					require.NoError(t, err)
				}
				rig.helm(t, "upgrade") // recreates what the release renders; Sandgate keeps running
				rig.judgesBy(t, cfg, rig.render(t, dnsOff))
			})
		})
	}
}

// The release and namespaces of rulesRig.
const (
	rulesRelease   = "sandgate"
	rulesNamespace = "sandgate"
	rulesSandboxes = "sandboxes" // the chart's default sandboxNamespaces
)

// rulesRig is a real apiserver with one release's CRDs, the chart installed by helm, and
// Sandgate's NetworkPolicy controller running as the release's ServiceAccount while installed.
type rulesRig struct {
	cluster    *kubetest.Cluster
	admin      kubernetes.Interface
	adminDyn   dynamic.Interface
	kubeconfig string
	ctx        context.Context
	stop       func()             // Sandgate's controller, while it runs
	running    *config.Kubernetes // its config
	probes     int
}

func newRulesRig(t *testing.T, release kubetest.Release) *rulesRig {
	t.Helper()
	rig := &rulesRig{cluster: kubetest.StartRelease(t, release), ctx: context.Background(), stop: func() {}}
	rig.admin, rig.adminDyn = kubetest.Clients(t, rig.cluster.Admin)
	rig.kubeconfig = kubetest.WriteKubeconfig(t, rig.cluster.Admin)
	ensureNamespace(t, rig.ctx, rig.admin, rulesNamespace)
	ensureNamespace(t, rig.ctx, rig.admin, rulesSandboxes)
	t.Cleanup(func() { rig.stop() })
	return rig
}

// helm runs `helm install|upgrade|uninstall` of the release with --set flags and plays what
// Kubernetes does to Sandgate's pods: on uninstall they stop, on a config the running one does
// not have they roll (the Deployment's checksum/config), otherwise they keep running. It returns
// the config the release renders.
func (rig *rulesRig) helm(t *testing.T, verb string, set ...string) config.Kubernetes {
	t.Helper()
	args := []string{verb, rulesRelease}
	if verb != "uninstall" {
		args = append(args, chartDir)
	}
	args = append(args, "--namespace", rulesNamespace, "--kubeconfig", rig.kubeconfig)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	if verb == "uninstall" {
		rig.stopController()
	}
	out, errOut, err := helm(t, args...)
	require.NoError(t, err, "helm %s:\n%s\n%s", strings.Join(args, " "), out, errOut)
	if verb == "uninstall" {
		return config.Kubernetes{}
	}
	cfg := rig.render(t, set...)
	if rig.running == nil || !reflect.DeepEqual(*rig.running, cfg) {
		rig.stopController()
		rig.runController(t, cfg)
	}
	return cfg
}

func (rig *rulesRig) stopController() {
	rig.stop()
	rig.stop, rig.running = func() {}, nil
}

// render is the Kubernetes config of the release with --set flags, as the chart renders it.
func (rig *rulesRig) render(t *testing.T, set ...string) config.Kubernetes {
	t.Helper()
	args := append([]string{"template", rulesRelease, chartDir, "--namespace", rulesNamespace}, valuesArgs(chartCase{}, set...)...)
	out, errOut, err := helm(t, args...)
	require.NoError(t, err, "helm template: %s", errOut)
	return materialize(t, parseObjects(t, out)).cfg.Kubernetes
}

// runController starts Sandgate's NetworkPolicy controller with cfg, as the release's
// ServiceAccount, until the next helm command.
func (rig *rulesRig) runController(t *testing.T, cfg config.Kubernetes) {
	t.Helper()
	sa := rest.CopyConfig(rig.cluster.Admin)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + rulesNamespace + ":" + rulesRelease,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + rulesNamespace, "system:authenticated"}}
	client, dyn := kubetest.Clients(t, sa)
	ctl, err := kube.NewController(client, dyn, cfg, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(rig.ctx)
	done := make(chan struct{})
	go func() { _ = ctl.Run(ctx); close(done) }()
	rig.stop, rig.running = func() { cancel(); <-done }, &cfg
}

// probe creates a Managed template in the sandbox namespace with the rules cfg renders (none
// for a zero cfg) and returns the apiserver's answer.
func (rig *rulesRig) probe(t *testing.T, cfg *config.Kubernetes) error {
	t.Helper()
	rig.probes++
	name := fmt.Sprintf("probe-%d", rig.probes)
	spec := map[string]any{"podTemplate": kubetest.PodTemplate()}
	if cfg != nil {
		obj, err := kube.RenderTemplate(*cfg, kube.Template{Namespace: rulesSandboxes, Name: name, Management: kube.Managed}).Templates[0].Object()
		require.NoError(t, err)
		np, _, _ := unstructured.NestedMap(obj.Object, "spec", "networkPolicy")
		require.NotEmpty(t, np)
		spec["networkPolicy"] = np
	}
	tpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": name, "namespace": rulesSandboxes}, "spec": spec}}
	_, err := rig.adminDyn.Resource(kubetest.SandboxTemplateGVR).Namespace(rulesSandboxes).Create(rig.ctx, tpl, metav1.CreateOptions{})
	return err
}

// judgesBy waits until a template with the rules of now is admitted and one with the rules of
// other is refused by the policy.
func (rig *rulesRig) judgesBy(t *testing.T, now, other config.Kubernetes) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, rig.probe(t, &now), "a template with the installed release's rules")
		err := rig.probe(t, &other)
		assert.True(c, apierrors.IsForbidden(err) && strings.Contains(fmt.Sprint(err), "spec.networkPolicy is not Sandgate's rules"),
			"a template with other rules is refused: %v", err)
	}, 60*time.Second, 200*time.Millisecond, "the policy does not judge by the installed release's rules")
}

// notEnforced waits until a template without rules is admitted: the apiserver has dropped the
// policy.
func (rig *rulesRig) notEnforced(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return rig.probe(t, nil) == nil }, 60*time.Second, 200*time.Millisecond,
		"the policy is still enforced")
}
