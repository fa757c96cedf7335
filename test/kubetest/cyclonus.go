package kubetest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
)

// CyclonusPeer is one end of a connection as cyclonus models it: a pod (namespace, its labels
// and the pod's) or, with External, an address outside the cluster.
type CyclonusPeer struct {
	External        bool
	IP              string
	Namespace       string
	NamespaceLabels map[string]string
	PodLabels       map[string]string
}

// CyclonusTraffic is one connection to ask cyclonus about. PortName is the destination pod's
// name for Port, if it has one (for policies that name ports).
type CyclonusTraffic struct {
	Source, Destination CyclonusPeer
	Port                int
	PortName            string
	Protocol            string // TCP, UDP or SCTP
}

// cyclonus's JSON shapes (matcher.Traffic, matcher.TrafficPeer, matcher.InternalPeer).
type cycTraffic struct {
	Source, Destination *cycPeer
	ResolvedPort        int
	ResolvedPortName    string
	Protocol            string
}

type cycPeer struct {
	Internal *cycInternal `json:",omitempty"`
	IP       string
}

type cycInternal struct {
	PodLabels, NamespaceLabels map[string]string
	Namespace                  string
}

var cyclonusVerdict = regexp.MustCompile(`(?i)is allowed\?\s*\|\s*(true|false)\b`)

// Cyclonus asks cyclonus (github.com/mattfenwick/cyclonus, `analyze --mode query-traffic`), an
// evaluator written independently of Sandgate's, whether policies allow each connection, and
// returns its answers in order. The binary is .tools/bin/cyclonus (test/setup.sh installs the
// pinned release) or $SANDGATE_CYCLONUS; missing, the test is skipped unless
// $SANDGATE_REQUIRE_TOOLS is set.
func Cyclonus(t testing.TB, policies []*networkingv1.NetworkPolicy, traffic []CyclonusTraffic) []bool {
	t.Helper()
	bin := os.Getenv("SANDGATE_CYCLONUS")
	if bin == "" {
		bin = filepath.Join(RepoRoot(), ".tools", "bin", "cyclonus")
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", bin)
		}
		t.Skipf("%s is missing: run test/setup.sh (set SANDGATE_REQUIRE_TOOLS=1 to fail instead)", bin)
	}
	dir := t.TempDir()
	list := networkingv1.NetworkPolicyList{}
	list.APIVersion, list.Kind = "networking.k8s.io/v1", "NetworkPolicyList"
	for _, p := range policies {
		list.Items = append(list.Items, withPolicyTypes(*p))
	}
	policyDir := filepath.Join(dir, "policies")
	if err := os.Mkdir(policyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(policyDir, "policies.json"), list)
	ts := make([]cycTraffic, 0, len(traffic))
	peer := func(p CyclonusPeer) *cycPeer {
		if p.External {
			return &cycPeer{IP: p.IP}
		}
		return &cycPeer{IP: p.IP, Internal: &cycInternal{PodLabels: nonNil(p.PodLabels), NamespaceLabels: nonNil(p.NamespaceLabels), Namespace: p.Namespace}}
	}
	for _, c := range traffic {
		ts = append(ts, cycTraffic{Source: peer(c.Source), Destination: peer(c.Destination),
			ResolvedPort: c.Port, ResolvedPortName: c.PortName, Protocol: c.Protocol})
	}
	trafficPath := filepath.Join(dir, "traffic.json")
	writeJSON(t, trafficPath, ts)

	cmd := exec.Command(bin, "analyze", "--mode", "query-traffic", "--policy-path", policyDir, "--traffic-path", trafficPath)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatalf("cyclonus: %v", err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cyclonus: %v\n%s", err, errOut.String())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("cyclonus did not finish in 2 minutes")
	}
	found := cyclonusVerdict.FindAllStringSubmatch(out.String(), -1)
	if len(found) != len(traffic) {
		t.Fatalf("cyclonus answered %d of %d connections:\n%s\n%s", len(found), len(traffic), out.String(), errOut.String())
	}
	answers := make([]bool, len(found))
	for i, m := range found {
		answers[i] = m[1] == "true" || m[1] == "TRUE"
	}
	return answers
}

// withPolicyTypes fills an empty spec.policyTypes as the apiserver does on create (Ingress, and
// Egress when there are egress rules): cyclonus reads stored objects and refuses policies
// without it. The cells of such policies check this defaulting, not cyclonus.
func withPolicyTypes(p networkingv1.NetworkPolicy) networkingv1.NetworkPolicy {
	if len(p.Spec.PolicyTypes) > 0 {
		return p
	}
	p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if len(p.Spec.Egress) > 0 {
		p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	}
	return p
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
