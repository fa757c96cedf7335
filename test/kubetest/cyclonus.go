package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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

// Cyclonus asks cyclonus (github.com/mattfenwick/cyclonus v0.5.6, the evaluator its `analyze
// --mode query-traffic` runs), written independently of Sandgate's, whether policies allow each
// connection, and returns its answers in order. The binary is .tools/bin/cyclonus, built by
// test/setup.sh from test/cyclonus (cyclonus's matcher against Sandgate's Kubernetes versions;
// it reads {"policies", "traffic"} as JSON on stdin and writes the verdicts), or
// $SANDGATE_CYCLONUS; missing, the test is skipped unless $SANDGATE_REQUIRE_TOOLS is set.
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
	q := struct {
		Policies []networkingv1.NetworkPolicy
		Traffic  []cycTraffic
	}{}
	for _, p := range policies {
		q.Policies = append(q.Policies, withPolicyTypes(*p))
	}
	peer := func(p CyclonusPeer) *cycPeer {
		if p.External {
			return &cycPeer{IP: p.IP}
		}
		return &cycPeer{IP: p.IP, Internal: &cycInternal{PodLabels: nonNil(p.PodLabels), NamespaceLabels: nonNil(p.NamespaceLabels), Namespace: p.Namespace}}
	}
	for _, c := range traffic {
		q.Traffic = append(q.Traffic, cycTraffic{Source: peer(c.Source), Destination: peer(c.Destination),
			ResolvedPort: c.Port, ResolvedPortName: c.PortName, Protocol: c.Protocol})
	}
	in, err := json.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("cyclonus: %v\n%s", err, errOut.String())
	}
	var answers []bool
	if err := json.Unmarshal(out.Bytes(), &answers); err != nil {
		t.Fatalf("cyclonus: %v in its answer %q", err, out.String())
	}
	if len(answers) != len(traffic) {
		t.Fatalf("cyclonus answered %d of %d connections: %s", len(answers), len(traffic), out.String())
	}
	return answers
}

// withPolicyTypes fills an empty spec.policyTypes as the apiserver does on create (Ingress, and
// Egress when there are egress rules): cyclonus models stored objects and refuses policies
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
