package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandgate/sandgate/bench"
)

var replicasOnly = flag.Bool("replicas", false, "run only the replicas cells (3 replicas on Redis and on a Cluster vs 1 with memory state; bench/replicas.go)")

// runReplicas runs only the replicas cells (bench.RunReplicas), writes them to
// OUT/LABEL-replicas.md and returns the exit code.
func runReplicas(ctx context.Context, o bench.Options) int {
	cells, err := bench.RunReplicas(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbench -replicas:", err)
		return 1
	}
	md := bench.ReplicasMarkdown(cells)
	path := filepath.Join(o.OutDir, o.Label+"-replicas.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "sandbench -replicas:", err)
		return 1
	}
	fmt.Print(md)
	fmt.Printf("report: %s\n", path)
	return 0
}
