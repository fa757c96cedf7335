package policy

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shared data cache answers a reference exactly as a read from the revision's store
// would, or not at all (the evaluator then reads the store, as it did without the cache).
func TestDataCacheAnswersAsTheStoreOrNotAtAll(t *testing.T) {
	data := map[string]any{
		"templates": map[string]any{"coding-agent": map[string]any{"hosts": []any{"a.example"}, "models": map[string]any{"anthropic": map[string]any{"max_tokens": 16}}}},
		"system":    map[string]any{"hidden": true},
		"list":      []any{"x", "y"},
	}
	store := inmem.NewFromObjectWithOpts(data, inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	var c dataCache
	c.load(store)
	storeRead := func(ref ast.Ref) ast.Value {
		ctx := context.Background()
		txn, err := store.NewTransaction(ctx)
		require.NoError(t, err)
		defer store.Abort(ctx, txn)
		path, err := storage.NewPathForRef(ref)
		require.NoError(t, err)
		v, err := store.Read(ctx, txn, path)
		if storage.IsNotFound(err) {
			return nil
		}
		require.NoError(t, err)
		return v.(ast.Value)
	}
	for _, tc := range []struct {
		ref      string
		answered bool
	}{
		{"data.templates", true},
		{`data.templates["coding-agent"].models.anthropic.max_tokens`, true},
		{`data.templates["coding-agent"].hosts`, true},
		{"data.system.hidden", true},
		{"data.templates.nope", false},                                          // not there: the store says not found
		{`data.templates["coding-agent"].hosts[0]`, false},                      // an array index: left to the store
		{"data.list[1]", false},                                                 // the same
		{`data.templates["coding-agent"].hosts.x`, false},                       // below an array
		{`data.templates["coding-agent"].models.anthropic.max_tokens.x`, false}, // below a number
	} {
		ref := ast.MustParseRef(tc.ref)
		got := c.Get(ref)
		if !tc.answered {
			assert.Nil(t, got, tc.ref)
			continue
		}
		require.NotNil(t, got, tc.ref)
		assert.Equal(t, 0, got.Compare(storeRead(ref)), tc.ref)
	}
	// The root is left to the store, whose read leaves out data.system.
	assert.Nil(t, c.Get(ast.MustParseRef("data")))
	c.Put(ast.MustParseRef("data.templates"), ast.String("ignored"))
	assert.Equal(t, 0, c.Get(ast.MustParseRef("data.templates")).Compare(storeRead(ast.MustParseRef("data.templates"))))
}
