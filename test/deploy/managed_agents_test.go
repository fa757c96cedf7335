package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/internal/kube/netpoleval"
	"github.com/sandgate/sandgate/test/kubetest"
)

// Loopback addresses the test gives the warm pool's workers (as their pod IPs), so that a client
// bound to one is that worker to Sandgate.
var workerAddrs = []string{"127.0.34.1", "127.0.34.2"}

// TestManagedAgentsExample applies docs/claude-managed-agents.md as written on a real
// kube-apiserver with the upstream Agent Sandbox controller: the chart with the example's values,
// the dispatcher's objects, the worker template (under the user's own field manager) and its
// warm pool; runs the built sandgate as the chart's ServiceAccount (a token the apiserver
// issued); the dispatcher, as its own ServiceAccount, claims a worker and registers a grant; the
// worker makes one allowed and one denied tool call; and the NetworkPolicies in the cluster let
// the dispatcher reach the worker on 8080 and nothing else.
func TestManagedAgentsExample(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cluster.StartController(t)
	cs, dyn := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mapper := newMapper(t, cs)
	example := filepath.Join(repoRoot, "examples", "claude-managed-agents")

	objs := render(t, chartCase{name: "managed-agents", values: filepath.Join(example, "values.yaml")}, "sandgate", "sandgate")
	for _, ns := range []string{"sandgate", "sandboxes"} {
		ensureNamespace(t, ctx, cs, ns)
	}
	// The worker runs under gVisor; a cluster with it installed has this RuntimeClass.
	_, err := cs.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, o := range objs {
		apply(t, ctx, dyn, mapper, o)
	}
	for _, o := range parseObjects(t, readFile(t, filepath.Join(example, "dispatcher.yaml"))) {
		applyAs(t, ctx, dyn, mapper, o, "kubectl")
	}

	github := githubUpstream(t)
	sg := startSandgate(t, cluster, objs, github)

	// The worker template, as the doc applies it: kubectl's own field manager. Its rules are the
	// release's, which the admission policy carries.
	tpl := parseObjects(t, readFile(t, filepath.Join(example, "worker-template.yaml")))
	require.Len(t, tpl, 1)
	require.Eventually(t, func() bool {
		_, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Apply(ctx, "coding-agent", tpl[0],
			metav1.ApplyOptions{FieldManager: "kubectl", Force: true})
		return err == nil
	}, 60*time.Second, 200*time.Millisecond, "the worker template is not admitted")
	for _, o := range parseObjects(t, readFile(t, filepath.Join(example, "warm-pool.yaml"))) {
		applyAs(t, ctx, dyn, mapper, o, "kubectl")
	}
	var workers []string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		pods, err := cs.CoreV1().Pods("sandboxes").List(ctx, metav1.ListOptions{})
		require.NoError(ct, err)
		workers = workers[:0]
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, "wp-coding-") {
				workers = append(workers, p.Name)
			}
		}
		assert.Len(ct, workers, 2)
	}, 60*time.Second, 100*time.Millisecond, "the warm pool's workers")
	for i, w := range workers {
		kubetest.SetPodIPs(t, cs, "sandboxes", w, workerAddrs[i])
	}

	t.Run("the template stays its author's; Sandgate's field manager owns its rules at most", func(t *testing.T) {
		got, err := dyn.Resource(kubetest.SandboxTemplateGVR).Namespace("sandboxes").Get(ctx, "coding-agent", metav1.GetOptions{})
		require.NoError(t, err)
		owned := map[string]string{}
		for _, mf := range got.GetManagedFields() {
			if mf.FieldsV1 != nil {
				owned[mf.Manager] = mf.FieldsV1.GetRawString()
			}
		}
		assert.Contains(t, owned["kubectl"], `"f:podTemplate"`)
		assert.NotContains(t, owned[kube.FieldManager], `"f:podTemplate"`, "the template already has Sandgate's rules: nothing to write")
		tmpl, err := kube.TemplateFromUnstructured(got)
		require.NoError(t, err)
		require.NotNil(t, tmpl.NetworkPolicy)
		m := materialize(t, objs)
		assert.Equal(t, kube.SandboxRules(m.cfg.Kubernetes), *tmpl.NetworkPolicy)
	})

	// The dispatcher, as its ServiceAccount: a claim for the task, then the grant.
	_, dispatcherDyn := kubetest.Clients(t, saConfig(t, cluster, cs, "agents-control", "dispatcher"))
	const task = "task-7f3a"
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": task, "namespace": "sandboxes"},
		"spec":     map[string]any{"warmPoolRef": map[string]any{"name": "wp-coding"}},
	}}
	_, err = dispatcherDyn.Resource(kubetest.SandboxClaimGVR).Namespace("sandboxes").Create(ctx, claim, metav1.CreateOptions{})
	require.NoError(t, err, "the dispatcher may claim")
	_, err = dispatcherDyn.Resource(kubetest.SandboxGVR).Namespace("sandboxes").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": map[string]any{"name": "own", "namespace": "sandboxes"},
		"spec": map[string]any{"podTemplate": kubetest.PodTemplate()}}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the dispatcher may not make Sandboxes: %v", err)
	var worker, idle string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		got, err := dispatcherDyn.Resource(kubetest.SandboxClaimGVR).Namespace("sandboxes").Get(ctx, task, metav1.GetOptions{})
		require.NoError(ct, err)
		ips, _, _ := unstructured.NestedStringSlice(got.Object, "status", "sandbox", "podIPs")
		if assert.Len(ct, ips, 1, "the claim names its worker's address") {
			worker = ips[0]
		}
	}, 60*time.Second, 100*time.Millisecond)
	for _, a := range workerAddrs {
		if a != worker {
			idle = a
		}
	}
	sg.grant(t, "sandboxes", task, "github_repos", []string{"acme/widgets"})

	t.Run("the claimed worker makes one allowed and one denied call", func(t *testing.T) {
		c := mcpSession(t, sg.mcp, worker)
		ok, text := callTool(t, c, "github_create_pull_request", map[string]any{"owner": "acme", "repo": "widgets"})
		assert.True(t, ok, text)
		assert.Contains(t, text, "pull request created")
		ok, text = callTool(t, c, "github_create_pull_request", map[string]any{"owner": "acme", "repo": "gadgets"})
		assert.False(t, ok)
		assert.Contains(t, text, `repository "acme/gadgets" is not granted`)

		var calls []audit.Event
		require.Eventually(t, func() bool { calls = sg.events(t, audit.KindToolsCall); return len(calls) >= 2 },
			20*time.Second, 50*time.Millisecond, "both calls are audited")
		require.Len(t, calls, 2)
		for i, allow := range []bool{true, false} {
			ev := calls[i]
			assert.Equal(t, allow, ev.Decision.Allow)
			assert.True(t, ev.Identity.Known)
			assert.Equal(t, "sandboxes", ev.Identity.Namespace)
			assert.Equal(t, task, ev.Identity.Claim, "grants and events go by claim")
			assert.Equal(t, "coding-agent", ev.Identity.Template)
			assert.True(t, strings.HasPrefix(ev.Identity.Sandbox, "wp-coding-"), "the pool's sandbox keeps its name")
		}
	})

	t.Run("an idle pool worker is an unknown caller, and its event says why", func(t *testing.T) {
		resp, err := fromAddr(idle).Post("http://"+sg.mcp+"/mcp", "application/json",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"idle","version":"1"}}}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		var mine []audit.Event
		require.Eventually(t, func() bool {
			mine = mine[:0]
			for _, ev := range sg.events(t, "") {
				if ev.Identity.SourceIP == idle {
					mine = append(mine, ev)
				}
			}
			return len(mine) > 0
		}, 20*time.Second, 50*time.Millisecond, "the idle worker's request has its event")
		for _, ev := range mine {
			assert.False(t, ev.Identity.Known)
			assert.Equal(t, "identity_unverified:warm_pool", ev.Identity.Unverified)
		}
	})

	t.Run("the dispatcher reaches the worker on 8080 and nothing else", func(t *testing.T) {
		var policies []*networkingv1.NetworkPolicy
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			policies = policies[:0]
			for _, ns := range []string{"sandboxes", "sandgate"} {
				l, err := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
				require.NoError(ct, err)
				for i := range l.Items {
					policies = append(policies, &l.Items[i])
				}
			}
			names := map[string]bool{}
			for _, np := range policies {
				names[np.Namespace+"/"+np.Name] = true
			}
			assert.True(ct, names["sandboxes/coding-agent-network-policy"], "the Agent Sandbox controller's policy of the template")
			assert.True(ct, names["sandboxes/"+kube.NamespaceDenyName])
			assert.True(ct, names["sandgate/"+kube.SandgateIngressName])
		}, 60*time.Second, 200*time.Millisecond)
		pod, err := cs.CoreV1().Pods("sandboxes").Get(ctx, workers[0], metav1.GetOptions{})
		require.NoError(t, err)
		at := func(name, ns, ip string, labels map[string]string) netpoleval.Endpoint {
			return netpoleval.PodEndpoint(&netpoleval.Pod{Name: name, Namespace: ns, Labels: labels, IP: netip.MustParseAddr(ip)})
		}
		workerEP := at("worker", "sandboxes", "10.8.0.1", pod.Labels)
		dispatcher := at("dispatcher", "agents-control", "10.8.1.1", map[string]string{"app": "dispatcher"})
		neighbour := at("neighbour", "agents-control", "10.8.1.2", map[string]string{"app": "batch"})
		impostor := at("impostor", "default", "10.8.2.1", map[string]string{"app": "dispatcher"})
		sandgatePod := at("sandgate", "sandgate", "10.8.3.1", map[string]string{"app.kubernetes.io/name": "sandgate", "app.kubernetes.io/instance": "sandgate"})
		c := netpoleval.Cluster{Policies: policies}
		for _, tc := range []struct {
			what     string
			from, to netpoleval.Endpoint
			port     int32
			want     bool
		}{
			{"dispatcher → worker task port", dispatcher, workerEP, 8080, true},
			{"dispatcher → worker, another port", dispatcher, workerEP, 9000, false},
			{"another pod of the dispatcher's namespace → worker", neighbour, workerEP, 8080, false},
			{"a pod labelled like the dispatcher elsewhere → worker", impostor, workerEP, 8080, false},
			{"worker → dispatcher", workerEP, dispatcher, 8080, false},
			{"worker → Sandgate MCP", workerEP, sandgatePod, 8080, true},
			{"worker → Sandgate admin", workerEP, sandgatePod, 9090, false},
			{"dispatcher → Sandgate admin (grants)", dispatcher, sandgatePod, 9090, true},
			{"dispatcher → Sandgate MCP", dispatcher, sandgatePod, 8080, false},
		} {
			got := c.Allowed(netpoleval.Connection{From: tc.from, To: tc.to, Protocol: corev1.ProtocolTCP, Port: tc.port})
			assert.Equal(t, tc.want, got, tc.what)
		}
	})
}

// githubUpstream is a Streamable HTTP MCP server named like the shipped policy's "github".
func githubUpstream(t *testing.T) string {
	s := server.NewMCPServer("github", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("create_pull_request", mcp.WithString("owner"), mcp.WithString("repo")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("pull request created"), nil
		})
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

// saConfig is a client config with a token the apiserver issued for ServiceAccount ns/name.
func saConfig(t *testing.T, cluster *kubetest.Cluster, cs kubernetes.Interface, ns, name string) *rest.Config {
	t.Helper()
	expiry := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.CopyConfig(cluster.Admin)
	cfg.BearerToken = tok.Status.Token
	return cfg
}

// sandgateProcess is the built sandgate serving the chart's config on loopback.
type sandgateProcess struct {
	mcp, admin, auditDir, adminToken string
}

// startSandgate runs the built binary with the chart's rendered config, its listeners moved to
// loopback, the github upstream at github, and the chart ServiceAccount's token as kubeconfig.
func startSandgate(t *testing.T, cluster *kubetest.Cluster, objs []*unstructured.Unstructured, github string) *sandgateProcess {
	t.Helper()
	cs, _ := kubetest.Clients(t, cluster.Admin)
	m := materialize(t, objs)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, m.config)), &cfg))
	sg := &sandgateProcess{mcp: freeLoopback(t), admin: freeLoopback(t), auditDir: m.cfg.Audit.File.Dir}
	cfg["listen"] = map[string]any{"mcp": sg.mcp, "proxy": freeLoopback(t), "admin": sg.admin}
	k := cfg["kubernetes"].(map[string]any)
	k["kubeconfig"] = kubetest.WriteKubeconfig(t, saConfig(t, cluster, cs, "sandgate", "sandgate"))
	ups := cfg["gateway"].(map[string]any)["upstreams"].([]any)
	ups[0].(map[string]any)["url"] = github
	// Stop at once on SIGTERM: shutdown.delay (the chart's rollout grace) would idle the cleanup.
	shutdown, _ := cfg["shutdown"].(map[string]any)
	if shutdown == nil {
		shutdown = map[string]any{}
	}
	shutdown["delay"] = "0s"
	cfg["shutdown"] = shutdown
	b, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	writeFile(t, m.config, string(b))
	for _, c := range m.cfg.Credentials {
		if c.Name == "admin-token" {
			sg.adminToken = strings.TrimSpace(readFile(t, c.File))
		}
	}

	var out bytes.Buffer
	cmd := exec.Command(sandgateBin(t), "serve", "--config", m.config)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("sandgate serve output:\n%s", out.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + sg.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 90*time.Second, 100*time.Millisecond, "sandgate is not ready")
	return sg
}

// grant registers value under name for claim through the admin API, as the dispatcher does.
func (sg *sandgateProcess) grant(t *testing.T, ns, claim, name string, value any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"value": value, "ttl": "2h"})
	req, err := http.NewRequest(http.MethodPut, "http://"+sg.admin+"/v1/grants/"+ns+"/claims/"+claim+"/"+name, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+sg.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// events reads the audit log's events of kind ("" for all).
func (sg *sandgateProcess) events(t *testing.T, kind audit.Kind) []audit.Event {
	t.Helper()
	f, err := os.Open(filepath.Join(sg.auditDir, "audit.log"))
	require.NoError(t, err)
	defer f.Close()
	var out []audit.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev audit.Event
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		if kind == "" || ev.Kind == kind {
			out = append(out, ev)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// fromAddr is an HTTP client whose connections come from src, the caller's identity.
func fromAddr(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 20 * time.Second}
}

// mcpSession initializes an MCP session with Sandgate's /mcp from src.
func mcpSession(t *testing.T, addr, src string) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient("http://"+addr+"/mcp", transport.WithHTTPBasicClient(fromAddr(src)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Start(ctx))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "worker", Version: "1"}
	_, err = c.Initialize(ctx, init)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// callTool calls a tool and returns whether it succeeded and its text.
func callTool(t *testing.T, c *client.Client, name string, args map[string]any) (ok bool, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return false, err.Error()
	}
	for _, ct := range res.Content {
		if tc, isText := ct.(mcp.TextContent); isText {
			text += tc.Text
		}
	}
	return !res.IsError, text
}

// The Managed Agents worker template carries exactly what `sandgate netpol` prints for the
// chart installed with the example's values (else the admission policy refuses it).
func TestManagedAgentsWorkerTemplateRulesAreGenerated(t *testing.T) {
	example := filepath.Join(repoRoot, "examples", "claude-managed-agents")
	objs := render(t, chartCase{name: "managed-agents", values: filepath.Join(example, "values.yaml")}, "sandgate", "sandgate")
	m := materialize(t, objs)
	gen := parseObjects(t, run(t, sandgateBin(t), "netpol", "--config", m.config, "--template", "sandboxes/coding-agent", "--management", kube.Managed))
	require.Len(t, gen, 1)
	tmpl := parseObjects(t, readFile(t, filepath.Join(example, "worker-template.yaml")))
	require.Len(t, tmpl, 1)
	want, _, _ := unstructured.NestedMap(gen[0].Object, "spec", "networkPolicy")
	got, _, _ := unstructured.NestedMap(tmpl[0].Object, "spec", "networkPolicy")
	assert.Equal(t, want, got, "worker-template.yaml spec.networkPolicy is the netpol output for values.yaml")
	assert.Equal(t, gen[0].GetName(), tmpl[0].GetName())
	assert.Equal(t, gen[0].GetNamespace(), tmpl[0].GetNamespace())
}
