package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Clients decide from a tool's annotations whether to ask the user before calling it; mcp-go's
// defaults (destructive, open world) would make every example tool look dangerous.
func TestToolsAdvertiseWhatTheyDo(t *testing.T) {
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		"echo":      {readOnly: true, idempotent: true},
		"add":       {readOnly: true, idempotent: true},
		"get-time":  {readOnly: true},
		"get-env":   {readOnly: true, idempotent: true},
		"ask-model": {readOnly: true, openWorld: true},
	}
	tools := newServer("mcp-upstream", "", "UPSTREAM_TOKEN", true).ListTools()
	require.Len(t, tools, len(want))
	for name, w := range want {
		tool := tools[name]
		require.NotNil(t, tool, name)
		a := tool.Tool.Annotations
		require.NotNil(t, a.ReadOnlyHint, name)
		require.NotNil(t, a.DestructiveHint, name)
		require.NotNil(t, a.IdempotentHint, name)
		require.NotNil(t, a.OpenWorldHint, name)
		got := hints{*a.ReadOnlyHint, *a.DestructiveHint, *a.IdempotentHint, *a.OpenWorldHint}
		assert.Equal(t, w, got, "annotations of %s", name)
	}
}
