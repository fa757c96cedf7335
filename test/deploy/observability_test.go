package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// promtoolBin finds promtool: $SANDGATE_PROMTOOL, else .tools/bin/promtool (test/setup.sh builds
// it). Without it the test is skipped, or fails under SANDGATE_REQUIRE_TOOLS.
func promtoolBin(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SANDGATE_PROMTOOL")
	if p == "" {
		p = filepath.Join(repoRoot, ".tools", "bin", "promtool")
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", p)
		}
		t.Skipf("%s is missing: run test/setup.sh", p)
	}
	return p
}

// The dashboard and the alerts are off by default, and when enabled render as a ConfigMap the
// Grafana sidecar picks up and a PrometheusRule that promtool accepts. (That their queries name
// only series the binary exports is cmd/sandgate's TestDashboardAndAlertsNameOnlyExportedSeries.)
func TestChartDashboardAndAlertRules(t *testing.T) {
	objs := render(t, chartCase{name: "default"}, "sg", "sandgate")
	if n := len(find(objs, "PrometheusRule")); n != 0 {
		t.Fatalf("a PrometheusRule is rendered by default (%d)", n)
	}
	args := []string{"template", "sg", chartDir, "--namespace", "sandgate",
		"--set", "grafanaDashboard.enabled=true", "--set", "prometheusRule.enabled=true",
		"--set", "prometheusRule.labels.release=kube-prometheus-stack"}
	out, errOut, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	objs = parseObjects(t, out)

	var dashboards int
	for _, cm := range find(objs, "ConfigMap") {
		if cm.GetLabels()["grafana_dashboard"] != "1" {
			continue
		}
		dashboards++
		data, _, _ := unstructured.NestedString(cm.Object, "data", "sandgate.json")
		var d struct {
			Panels []struct {
				Title   string           `json:"title"`
				Targets []map[string]any `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		var titles []string
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			titles = append(titles, strings.ToLower(p.Title))
		}
		joined := strings.Join(titles, "|")
		for _, want := range []string{"decision code", "latency", "sessions", "upstream", "limits", "audit queue", "redis",
			"claim-to-ready", "warm pool", "sandbox lifetime", "audit export"} {
			if !strings.Contains(joined, want) {
				t.Errorf("no dashboard panel about %q (panels: %s)", want, joined)
			}
		}
	}
	if dashboards != 1 {
		t.Fatalf("want 1 ConfigMap labelled grafana_dashboard=1, got %d", dashboards)
	}

	rules := find(objs, "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("want 1 PrometheusRule, got %d", len(rules))
	}
	if rules[0].GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("prometheusRule.labels not applied: %v", rules[0].GetLabels())
	}
	spec, err := yaml.Marshal(rules[0].Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range []string{"SandgateAuditWriteFailures", "SandgatePolicyReloadFailing", "SandgatePolicyStale",
		"SandgateUpstreamDown", "SandgateRedisDegraded", "SandgateDenyRateSpike", "SandgateNetworkPolicyDriftRepaired"} {
		if !strings.Contains(string(spec), "alert: "+alert) {
			t.Errorf("alert %s is missing", alert)
		}
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(promtoolBin(t), "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, b)
	}
}
