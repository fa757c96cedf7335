package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandgate/sandgate/bench"
)

// runReplicas runs only the replicas cells (bench.RunReplicas) and writes them to
// OUT/LABEL-replicas.md.
func runReplicas(ctx context.Context, o bench.Options) error {
	cells, err := bench.RunReplicas(ctx, o)
	if err != nil {
		return err
	}
	md := bench.ReplicasMarkdown(cells)
	path := filepath.Join(o.OutDir, o.Label+"-replicas.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Printf("report: %s\n", path)
	return nil
}
