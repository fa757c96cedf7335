package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/test/redistest"
)

// eventOnlySeries appear only after the event they count; each is exercised elsewhere, as noted.
var eventOnlySeries = map[string]string{
	"sandgate_audit_write_errors_total":     "first audit write that fails (internal/call counts it; the writer refuses calls then)",
	"sandgate_policy_reload_failures_total": "first failed reload (TestReadyzReportsAPolicyReloadFailure in main_test.go)",
	"sandgate_kube_drift_total":             "first NetworkPolicy drift repaired (internal/kube/apiserver_test.go; needs the kube controller)",
	"sandgate_shared_state_errors_total":    "first Redis error (TestReplicasShareState stops redis)",
	// The lifecycle series need the Kubernetes resolver and a claim, a pool or a deleted sandbox.
	"sandgate_sandbox_claim_ready_seconds_bucket": "first claim ready (TestLifecycleMetricsWithController, internal/identity/kubeid)",
	"sandgate_warm_pool_ready_sandboxes":          "first warm pool seen (TestLifecycleMetricsWithController, internal/identity/kubeid)",
	"sandgate_sandbox_lifetime_seconds_bucket":    "first sandbox deleted (TestLifecycleMetricsWithController, internal/identity/kubeid)",
}

// seriesRE finds metric names in PromQL: every Sandgate metric starts with sandgate_.
var seriesRE = regexp.MustCompile(`\bsandgate_[a-z0-9_]+`)

// TestDashboardAndAlertsNameOnlyExportedSeries scrapes a serving replica after a few requests of
// each kind and checks that every series the chart's dashboard and alerts query exists.
func TestDashboardAndAlertsNameOnlyExportedSeries(t *testing.T) {
	srv := redistest.Start(t)
	r := startReplica(t, "metrics", srv.Addr, githubUpstream(t), modelAPI(t))
	c := r.mcpSession(t, triageAddr)
	for range 4 { // the fourth is over triage-agent's 3 requests/minute
		callTool(t, c, "get_issue", nil)
	}
	callTool(t, r.mcpSession(t, coderAddr), "create_pull_request", map[string]any{"owner": "acme", "repo": "api"})
	r.modelRequest(t, coderAddr, false)
	r.modelRequest(t, spenderAddr, true)

	referenced := map[string][]string{}
	for _, q := range dashboardQueries(t) {
		for _, name := range seriesRE.FindAllString(q, -1) {
			referenced[name] = append(referenced[name], "dashboard: "+q)
		}
	}
	for _, q := range alertQueries(t) {
		for _, name := range seriesRE.FindAllString(q, -1) {
			referenced[name] = append(referenced[name], "alert: "+q)
		}
	}
	require.NotEmpty(t, referenced)
	var names []string
	for n := range referenced {
		if why, ok := eventOnlySeries[n]; !ok || why == "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)

	// Some series are recorded when a call's event is finished, after its answer reached the
	// client: scrape until every name is there, with a deadline a busy machine meets.
	var exported map[string]bool
	deadline := time.Now().Add(20 * time.Second)
	for {
		exported = exportedNames(t, r.admin)
		if missing(names, exported) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, name := range names {
		assert.True(t, exported[name], "%s is not exported by sandgate serve; used by %v", name, referenced[name])
	}
}

// exportedNames returns the names of the series admin's /metrics exports.
func exportedNames(t *testing.T, admin string) map[string]bool {
	exported := map[string]bool{}
	for _, series := range scrapeSeries(t, admin) {
		exported[seriesRE.FindString(series)] = true
	}
	return exported
}

// missing counts the names not in exported.
func missing(names []string, exported map[string]bool) int {
	n := 0
	for _, name := range names {
		if !exported[name] {
			n++
		}
	}
	return n
}

// dashboardQueries returns the expr of every target of every panel of the chart's dashboard.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, "charts/sandgate/files/dashboard.json"))
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// alertQueries returns the expr of every rule of the chart's alert rules.
func alertQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, "charts/sandgate/files/alerts.yaml"))
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Expr string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &rules))
	var out []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

// TestDumpMetrics prints what a replica exports (go test -run TestDumpMetrics -v).
func TestDumpMetrics(t *testing.T) {
	if os.Getenv("SANDGATE_DUMP_METRICS") == "" {
		t.Skip("set SANDGATE_DUMP_METRICS=1")
	}
	srv := redistest.Start(t)
	r := startReplica(t, "metrics", srv.Addr, githubUpstream(t), modelAPI(t))
	c := r.mcpSession(t, triageAddr)
	for range 4 {
		callTool(t, c, "get_issue", nil)
	}
	r.modelRequest(t, coderAddr, false)
	resp, err := http.Get("http://" + r.admin + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Log(string(body))
}
