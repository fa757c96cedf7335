// Command cyclonus is the NetworkPolicy cross-check of Sandgate's tests: cyclonus's own
// evaluator (github.com/mattfenwick/cyclonus, its matcher package, which its `analyze --mode
// query-traffic` runs), written independently of Sandgate's internal/kube/netpoleval. It reads
// {"policies": [NetworkPolicy…], "traffic": [cyclonus Traffic…]} on stdin and writes one
// verdict per connection, in order, as a JSON array of booleans.
//
// It is its own module so cyclonus builds against Sandgate's Kubernetes versions (go.mod), not
// the v0.30.2 of its release: on a cold machine that release compiled a third copy of the
// Kubernetes client libraries (issue 39). Its go.sum pins the release's module hash.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	networkingv1 "k8s.io/api/networking/v1"
)

type query struct {
	Policies []*networkingv1.NetworkPolicy
	Traffic  []*matcher.Traffic
}

func main() {
	answers, err := answer(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cyclonus:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(answers); err != nil {
		fmt.Fprintln(os.Stderr, "cyclonus:", err)
		os.Exit(1)
	}
}

func answer(in io.Reader) (answers []bool, err error) {
	// The matcher panics on a policy it cannot model (no policy type, an invalid peer or port).
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	var q query
	if err := json.NewDecoder(io.LimitReader(in, 64<<20)).Decode(&q); err != nil {
		return nil, fmt.Errorf("reading the query: %w", err)
	}
	// Simplified, as the analyze command builds them by default (--simplify-policies).
	model := matcher.BuildNetworkPolicies(true, q.Policies)
	answers = make([]bool, 0, len(q.Traffic))
	for i, t := range q.Traffic {
		if t == nil || t.Source == nil || t.Destination == nil {
			return nil, fmt.Errorf("traffic[%d]: source and destination are required", i)
		}
		answers = append(answers, model.IsTrafficAllowed(t).IsAllowed())
	}
	return answers, nil
}
