package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/kube"
)

// Every values file lints and renders; the Deployment has the hardening the chart promises.
func TestChartLintsAndRendersHardenedDeployment(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"lint", "--strict", chartDir}, valuesArgs(c)...)
			out, errOut, err := helm(t, args...)
			require.NoError(t, err, "helm %s\n%s%s", strings.Join(args, " "), out, errOut)

			objs := render(t, c, "sandgate", "sandgate")
			checkAuditKeysSecret(t, objs)
			for _, o := range objs {
				if o.GetKind() == "ValidatingAdmissionPolicy" || o.GetKind() == "ValidatingAdmissionPolicyBinding" {
					continue // cluster-scoped, and named after the release and its namespace
				}
				assert.NotEmpty(t, o.GetNamespace(), "%s %s has no namespace", o.GetKind(), o.GetName())
			}
			var d appsv1.Deployment
			typed(t, one(t, objs, "Deployment", "sandgate"), &d)
			pod := d.Spec.Template.Spec
			require.NotNil(t, pod.SecurityContext)
			assert.Equal(t, true, *pod.SecurityContext.RunAsNonRoot)
			assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SecurityContext.SeccompProfile.Type)
			require.Len(t, pod.Containers, 1)
			ctr := pod.Containers[0]
			sc := ctr.SecurityContext
			assert.True(t, *sc.ReadOnlyRootFilesystem, "read-only root filesystem")
			assert.False(t, *sc.AllowPrivilegeEscalation)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			assert.Equal(t, "/healthz", ctr.LivenessProbe.HTTPGet.Path)
			assert.Equal(t, "/readyz", ctr.ReadinessProbe.HTTPGet.Path)
			assert.Equal(t, "admin", ctr.ReadinessProbe.HTTPGet.Port.StrVal)
			assert.NotEmpty(t, ctr.Resources.Requests)
			assert.NotEmpty(t, ctr.Resources.Limits)
			memEnv := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "SANDGATE_CONTAINER_MEMORY" })
			require.GreaterOrEqual(t, memEnv, 0, "serve derives Go's soft memory limit from the container's")
			require.NotNil(t, ctr.Env[memEnv].ValueFrom)
			assert.Equal(t, "limits.memory", ctr.Env[memEnv].ValueFrom.ResourceFieldRef.Resource)
			// serve drains listeners for up to 20 s, then flushes the audit log for up to 10 s.
			assert.GreaterOrEqual(t, *pod.TerminationGracePeriodSeconds, int64(35))
			assert.NotNil(t, pod.Affinity.PodAntiAffinity)
			assert.Regexp(t, `^[0-9a-f]{64}$`, d.Spec.Template.Annotations["checksum/config"])
			assert.Equal(t, []string{"serve", "--config", "/etc/sandgate/config/sandgate.yaml"}, ctr.Args)

			m := materialize(t, objs)
			assert.Equal(t, m.cfg.Kubernetes.Enabled, *pod.AutomountServiceAccountToken,
				"the API token is mounted exactly when Sandgate reads the cluster")
			checkSecretMounts(t, pod, m)
			if d.Spec.Replicas == nil {
				assert.Len(t, find(objs, "HorizontalPodAutoscaler"), 1, "no replicas: an HPA owns the count")
			}
			assert.Len(t, find(objs, "Service"), 2, "one Service for sandboxes (mcp, proxy), one for admin")
			for _, s := range find(objs, "Service") {
				var svc corev1.Service
				typed(t, s, &svc)
				for _, p := range svc.Spec.Ports {
					if strings.HasSuffix(s.GetName(), "-admin") {
						assert.Equal(t, "admin", p.Name)
					} else {
						assert.NotEqual(t, "admin", p.Name, "the sandboxes' Service must not expose the admin port")
					}
				}
			}
		})
	}
}

// Each Secret-backed credential of the config is a file in a read-only Secret volume mounted
// where the config says, and proxy.ca points into the CA Secret's mount.
func checkSecretMounts(t *testing.T, pod corev1.PodSpec, m materialized) {
	t.Helper()
	local := func(p string) string { return "/" + strings.TrimPrefix(strings.TrimPrefix(p, m.root), "/") }
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	files := map[string]string{} // path in the pod -> Secret/key
	for _, vm := range pod.Containers[0].VolumeMounts {
		v := volumes[vm.Name]
		if v.Secret == nil {
			continue
		}
		assert.True(t, vm.ReadOnly, "Secret volume %s is mounted read-only", vm.Name)
		for _, it := range v.Secret.Items {
			files[filepath.Join(vm.MountPath, it.Path)] = v.Secret.SecretName + "/" + it.Key
		}
	}
	for _, c := range m.cfg.Credentials {
		if c.File != "" {
			assert.Contains(t, files, local(c.File), "credential %s is read from a mounted Secret", c.Name)
		}
	}
	if m.cfg.Proxy.CA.Cert != "" {
		assert.Contains(t, files, local(m.cfg.Proxy.CA.Cert))
		assert.Contains(t, files, local(m.cfg.Proxy.CA.Key))
	}
}

// The config and policies the chart renders load in the real binary: the chart cannot drift
// from the config struct or the policy engine.
func TestChartConfigAndPoliciesLoadInBinary(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			objs := render(t, c, "sandgate", "sandgate")
			m := materialize(t, objs)
			bin := sandgateBin(t)
			out := run(t, bin, "serve", "--check-config", "--config", m.config)
			assert.Contains(t, out, "is valid")
			if tests, _ := filepath.Glob(filepath.Join(m.policyDir, "*_test.rego")); len(tests) == 0 {
				// policies.includeTests: false — run the shipped tests against what is served.
				shipped, _ := filepath.Glob(filepath.Join(chartDir, "policies", "*_test.rego"))
				for _, f := range shipped {
					b, err := os.ReadFile(f)
					require.NoError(t, err)
					writeFile(t, filepath.Join(m.policyDir, filepath.Base(f)), string(b))
				}
			}
			out = run(t, bin, "policy", "test", m.policyDir)
			t.Log(strings.TrimSpace(out))
		})
	}
}

// The chart's Roles are internal/kube/rbac.go's rules, namespace by namespace, bound to the chart's
// ServiceAccount; its NetworkPolicy is kube.SandgateIngress of the rendered config.
func TestChartRBACAndNetworkPolicyMatchKubePackage(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			objs := render(t, c, "sandgate", "sandgate")
			m := materialize(t, objs)
			k := m.cfg.Kubernetes
			var sa string
			if sas := find(objs, "ServiceAccount"); len(sas) == 1 {
				sa = sas[0].GetName()
			}

			gotRules := map[string][]rbacv1.PolicyRule{}
			gotSubjects := map[string][]rbacv1.Subject{}
			for _, o := range find(objs, "Role") {
				var r rbacv1.Role
				typed(t, o, &r)
				gotRules[r.Namespace] = r.Rules
			}
			for _, o := range find(objs, "RoleBinding") {
				var b rbacv1.RoleBinding
				typed(t, o, &b)
				assert.Equal(t, "Role", b.RoleRef.Kind)
				gotSubjects[b.Namespace] = b.Subjects
			}
			assert.Empty(t, find(objs, "ClusterRole"), "namespaced permissions only")
			assert.Empty(t, find(objs, "ClusterRoleBinding"), "namespaced permissions only")
			if !k.Enabled {
				assert.Empty(t, gotRules, "no cluster access without kubernetes.enabled")
			} else {
				wantRules := map[string][]rbacv1.PolicyRule{}
				wantSubjects := map[string][]rbacv1.Subject{}
				var jwks string
				if rt := m.cfg.RunTokens; rt != nil && rt.JWKSSecret != nil {
					jwks = rt.JWKSSecret.Name
				}
				for _, o := range kube.RBAC(k, kube.RBACSubject{Kind: rbacv1.ServiceAccountKind, Namespace: "sandgate", Name: sa}, jwks) {
					switch o := o.(type) {
					case *rbacv1.Role:
						wantRules[o.Namespace] = o.Rules
					case *rbacv1.RoleBinding:
						wantSubjects[o.Namespace] = o.Subjects
					}
				}
				assert.Equal(t, wantRules, gotRules, "chart Roles differ from internal/kube/rbac.go")
				assert.Equal(t, wantSubjects, gotSubjects, "chart RoleBindings differ from internal/kube/rbac.go")
			}

			nps := find(objs, "NetworkPolicy")
			if !k.Enabled || k.Controller.Enabled {
				assert.Empty(t, nps, "without kubernetes, or with the controller applying it, the chart renders no NetworkPolicy")
				return
			}
			require.Len(t, nps, 1)
			var got networkingv1.NetworkPolicy
			typed(t, nps[0], &got)
			want := kube.SandgateIngress(k)
			assert.Equal(t, want.Name, got.Name)
			assert.Equal(t, want.Namespace, got.Namespace)
			assert.Equal(t, want.Spec, got.Spec, "chart NetworkPolicy differs from kube.SandgateIngress")
			assert.Equal(t, kube.RoleIngress, got.Labels[kube.LabelRole])
		})
	}
}

// Wrong values fail `helm template` and `helm lint` with a message naming the value.
func TestChartSchemaRejectsWrongValues(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		want []string
	}{
		{"replica count that is not a number", []string{"replicaCount=two"}, []string{"/replicaCount", "want integer"}},
		{"credential given inline as a value", []string{"credentials[0].name=anthropic", "credentials[0].value=sk-ant-123"},
			[]string{"/credentials/0", "'value' not allowed", "'secretName', 'key'"}},
		{"credential value inside config", []string{"config.credentials[0].name=anthropic", "config.credentials[0].value=sk-ant-123"},
			[]string{"/config/credentials/0", "'value' not allowed"}},
		{"unknown top-level key", []string{"replicas=3"}, []string{"additional properties 'replicas' not allowed"}},
		{"port out of range", []string{"ports.proxy=70000"}, []string{"/ports/proxy"}},
		{"sandbox namespace that is not a DNS label", []string{"sandboxNamespaces[0]=Sandboxes"}, []string{"/sandboxNamespaces/0"}},
		{"grace period too short to flush the audit log", []string{"terminationGracePeriodSeconds=5"}, []string{"/terminationGracePeriodSeconds"}},
		{"OTLP auth token given inline", []string{"audit.otlp.endpoint=https://c:4318", "audit.otlp.authSecret.value=sk-ant-123"},
			[]string{"/audit/otlp/authSecret", "'value' not allowed"}},
		{"OTLP protocol that is not one", []string{"audit.otlp.protocol=udp"}, []string{"/audit/otlp/protocol"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range []string{"template", "lint"} {
				args := []string{cmd}
				if cmd == "template" {
					args = append(args, "sandgate")
				}
				args = append(args, chartDir)
				args = append(args, valuesArgs(chartCase{}, tc.set...)...)
				out, errOut, err := helm(t, args...)
				require.Error(t, err, "helm %s accepted %v", cmd, tc.set)
				msg := out + errOut
				assert.Contains(t, msg, "values don't meet the specifications of the schema")
				for _, w := range tc.want {
					assert.Contains(t, msg, w, "helm %s", cmd)
				}
				assert.NotContains(t, errOut, "sk-ant-123", "a rejected credential value is not echoed")
			}
		})
	}
	for _, tc := range []struct {
		name, want string
		set        []string
	}{
		{"audit reserve larger than its volume", "config.audit.file.reserve_mb (4096 MiB) does not fit the audit volume (2Gi)", []string{"config.audit.file.reserve_mb=4096"}},
		{"grace shorter than the shutdown", "terminationGracePeriodSeconds 20 is shorter than shutdown.delaySeconds + shutdown.drainSeconds + 10 (35)", []string{"terminationGracePeriodSeconds=20"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, err := helm(t, append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, tc.set...)...)...)
			require.Error(t, err)
			assert.Contains(t, errOut, tc.want)
		})
	}
	t.Run("several replicas on one ReadWriteOnce audit volume", func(t *testing.T) {
		_, errOut, err := helm(t, append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, "audit.persistence.enabled=true", "replicaCount=2")...)...)
		require.Error(t, err)
		assert.Contains(t, errOut, "several replicas cannot share a ReadWriteOnce volume")
	})
}

// The pod's grace covers what serve does on SIGTERM: the delay, the drain and the audit flush.
func TestChartGraceFollowsTheShutdown(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want int64
	}{{nil, 35}, {[]string{"shutdown.drainSeconds=60"}, 75}, {[]string{"terminationGracePeriodSeconds=120"}, 120}} {
		out, errOut, err := helm(t, append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, tc.set...)...)...)
		require.NoError(t, err, errOut)
		var dep appsv1.Deployment
		typed(t, one(t, parseObjects(t, out), "Deployment", "sandgate"), &dep)
		require.NotNil(t, dep.Spec.Template.Spec.TerminationGracePeriodSeconds)
		assert.Equal(t, tc.want, *dep.Spec.Template.Spec.TerminationGracePeriodSeconds, "%v", tc.set)
	}
}

// charts/sandgate/policies is a copy of policies/ (Helm cannot read outside the chart).
func TestChartPoliciesEqualRepositoryPolicies(t *testing.T) {
	want := readDir(t, filepath.Join(repoRoot, "policies"))
	got := readDir(t, filepath.Join(chartDir, "policies"))
	var differ []string
	for name, content := range want {
		if got[name] != content {
			differ = append(differ, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			differ = append(differ, name+" (not in policies/)")
		}
	}
	slices.Sort(differ)
	assert.Empty(t, differ, "charts/sandgate/policies differs from policies/: run `make chart-sync`")
}

// The Dockerfile builds with `make build` (so with the Makefile's flags) on pinned images, and the
// binary those flags make is static and runs.
func TestDockerfileBuildsLikeMakeBuild(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	df := string(b)
	assert.Regexp(t, `(?m)^\s*make build\b|RUN .*make build\b`, df, "the image's binary is built by `make build`")
	assert.NotRegexp(t, `(?m)^RUN[^\n]*go build`, df, "no second set of build flags in the Dockerfile")
	for _, m := range regexp.MustCompile(`(?m)^ARG (\w+_IMAGE)=(\S+)$`).FindAllStringSubmatch(df, -1) {
		assert.Regexp(t, `:[0-9][^:]*$|:nonroot$|@sha256:`, m[2], "%s is pinned", m[1])
		assert.NotContains(t, m[2], ":latest")
	}
	stages := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(df, -1)
	require.GreaterOrEqual(t, len(stages), 2, "multi-stage build")
	final := df[stages[len(stages)-1][0]:]
	assert.Regexp(t, `(?m)^USER [1-9][0-9]*:[1-9][0-9]*$`, final, "the runtime stage runs as a numeric non-root user")
	assert.Contains(t, final, "COPY --from=build /src/bin/sandgate ")

	bin := sandgateBin(t)
	require.NoError(t, staticELF(bin), "the binary of `make build`'s flags is static")
	out := run(t, bin, "version")
	assert.Contains(t, out, buildVersion, "the version is stamped by the Makefile's -ldflags")
}

// examples/sandbox-template.netpol.yaml is what `sandgate netpol` prints for the example
// template under the chart's default config, and the example template carries those rules.
func TestExampleSandboxTemplateNetpolIsGenerated(t *testing.T) {
	objs := render(t, chartCase{name: "default"}, "sandgate", "sandgate")
	m := materialize(t, objs)
	got := run(t, sandgateBin(t), "netpol", "--config", m.config, "--template", "sandboxes/coding-agent", "--management", kube.Managed)
	b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "sandbox-template.netpol.yaml"))
	require.NoError(t, err)
	committed := string(b)
	for strings.HasPrefix(committed, "#") { // the header comment
		_, committed, _ = strings.Cut(committed, "\n")
	}
	assert.Equal(t, got, committed, "regenerate examples/sandbox-template.netpol.yaml (its header says how)")

	tmpl := parseObjects(t, readFile(t, filepath.Join(repoRoot, "examples", "sandbox-template.yaml")))
	require.Len(t, tmpl, 1)
	gen := parseObjects(t, got)
	require.Len(t, gen, 1)
	wantNP, _, _ := unstructured.NestedMap(gen[0].Object, "spec", "networkPolicy")
	gotNP, _, _ := unstructured.NestedMap(tmpl[0].Object, "spec", "networkPolicy")
	assert.Equal(t, wantNP, gotNP, "examples/sandbox-template.yaml spec.networkPolicy is the netpol output")
	assert.Equal(t, gen[0].GetName(), tmpl[0].GetName())
	assert.Equal(t, gen[0].GetNamespace(), tmpl[0].GetNamespace())

	// The worker's wiring points at names and ports the chart serves.
	pod, _, _ := unstructured.NestedMap(tmpl[0].Object, "spec", "podTemplate", "spec")
	assert.Equal(t, "gvisor", pod["runtimeClassName"])
	assert.Equal(t, false, pod["automountServiceAccountToken"])
	env := map[string]string{}
	ctrs, _, _ := unstructured.NestedSlice(pod, "containers")
	require.NotEmpty(t, ctrs)
	envs, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "env")
	for _, e := range envs {
		e := e.(map[string]any)
		env[e["name"].(string)], _ = e["value"].(string)
	}
	host := "sandgate.sandgate.svc.cluster.local"
	assert.True(t, slices.Contains(m.cfg.Gateway.AllowedHosts, host), "/mcp accepts the Host the worker sends")
	assert.Equal(t, "http://"+host+m.cfg.Listen.Proxy, env["HTTPS_PROXY"])
	assert.Equal(t, "http://"+host+m.cfg.Listen.MCP+"/mcp", env["SANDGATE_MCP_URL"])
	assert.Equal(t, "http://"+host+m.cfg.Listen.Proxy+"/routes/anthropic", env["ANTHROPIC_BASE_URL"])
	assert.Contains(t, env["ANTHROPIC_API_KEY"], "placeholder")
	assert.Equal(t, "/etc/sandgate/ca.crt", env["SSL_CERT_FILE"])
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The decision log is on by default, beside the audit log on its volume, bounded; off when
// asked; and a size that does not fit the volume with the audit reserve fails the rendering.
func TestChartDecisionLogIsOnByDefaultAndBounded(t *testing.T) {
	configOf := func(set ...string) *config.Config {
		args := append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, set...)...)
		out, errOut, err := helm(t, args...)
		require.NoError(t, err, errOut)
		doc := configMapData(t, one(t, parseObjects(t, out), "ConfigMap", "-config"))["sandgate.yaml"]
		cfg, err := config.Parse([]byte(doc), "/etc/sandgate/config")
		require.NoError(t, err, doc)
		return cfg
	}
	dl := configOf().Policy.DecisionLog
	assert.Equal(t, "/var/lib/sandgate/audit/decisions/decisions.log", dl.File, "on the audit volume, under the audit folder")
	assert.Equal(t, 64, dl.MaxSizeMB)
	assert.Equal(t, 4, dl.MaxFiles)
	assert.Nil(t, dl.Mask, "Sandgate's default mask: every tool-call argument value")
	assert.Equal(t, []string{"/input/grants"}, configOf("policies.decisionLog.mask[0]=/input/grants").Policy.DecisionLog.Mask)
	assert.Empty(t, configOf("policies.decisionLog.enabled=false").Policy.DecisionLog.File)

	_, errOut, err := helm(t, append([]string{"template", "sandgate", chartDir}, valuesArgs(chartCase{}, "policies.decisionLog.maxSizeMB=1000")...)...)
	require.Error(t, err)
	assert.Contains(t, errOut, "policies.decisionLog (maxSizeMB × (maxFiles + 1) = 5000 MiB) and the audit reserve (32 MiB) do not fit the audit volume (2Gi)")
}
