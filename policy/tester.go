package policy

import (
	"context"
	"fmt"
	"io"
	"io/fs"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestSummary counts the Rego tests of one run.
type TestSummary struct {
	Passed, Failed, Errored, Skipped int
}

// OK reports whether every test passed and at least one ran.
func (s TestSummary) OK() bool { return s.Failed == 0 && s.Errored == 0 && s.Passed > 0 }

// RunTests runs the *_test.rego tests of the folders, as `opa test` would, writing OPA's report
// to w. The test files are loaded together with the policies and data they test.
func RunTests(ctx context.Context, w io.Writer, verbose bool, dirs ...string) (TestSummary, error) {
	return runTests(ctx, tester.PrettyReporter{Output: w, Verbose: verbose, FailureLine: true}, dirs)
}

// RunTestsJSON is RunTests writing OPA's JSON report (`opa test --format=json`): one array of
// every test's result, for CI.
func RunTestsJSON(ctx context.Context, w io.Writer, dirs ...string) (TestSummary, error) {
	return runTests(ctx, tester.JSONReporter{Output: w}, dirs)
}

func runTests(ctx context.Context, reporter tester.Reporter, dirs []string) (TestSummary, error) {
	var sum TestSummary
	keepAll := func(_ string, info fs.FileInfo, depth int) bool {
		return skipFile("", info, depth) && !isTestFile(info)
	}
	modules, store, err := tester.LoadWithRegoVersion(dirs, keepAll, ast.RegoV1)
	if err != nil {
		return sum, fmt.Errorf("load policies: %w", err)
	}
	txn, err := store.NewTransaction(ctx, storage.TransactionParams{})
	if err != nil {
		return sum, fmt.Errorf("open policy store: %w", err)
	}
	defer store.Abort(ctx, txn)
	ch, err := tester.NewRunner().
		SetModules(modules).
		SetStore(store).
		SetDefaultRegoVersion(ast.RegoV1).
		RaiseBuiltinErrors(true).
		RunTests(ctx, txn)
	if err != nil {
		return sum, fmt.Errorf("run policy tests: %w", err)
	}
	results := make(chan *tester.Result)
	done := make(chan error, 1)
	go func() {
		done <- reporter.Report(results)
	}()
	for r := range ch {
		switch {
		case r.Skip:
			sum.Skipped++
		case r.Error != nil:
			sum.Errored++
		case r.Fail:
			sum.Failed++
		default:
			sum.Passed++
		}
		results <- r
	}
	close(results)
	if err := <-done; err != nil {
		return sum, fmt.Errorf("report policy tests: %w", err)
	}
	return sum, nil
}

func isTestFile(info fs.FileInfo) bool {
	return !info.IsDir() && len(info.Name()) > len("_test.rego") && info.Name()[len(info.Name())-len("_test.rego"):] == "_test.rego"
}
