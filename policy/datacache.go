package policy

import (
	"context"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
)

// dataCache is a topdown.BaseCache over a revision's data, shared by all its evaluations.
//
// OPA's default base cache lives for one evaluation: every decision read data through a
// storage transaction (a path built from the reference, the in-memory store's walk) and
// remembered the result in a fresh cache tree. A revision's data never changes once loaded
// (nothing writes to its store), so a reference into it resolves to the same value in every
// evaluation: this cache answers it by a lookup in the data document the store holds, without
// a transaction or an allocation. It answers only what a store read answers the same way — a
// path of string keys below the root; anything else (the root, which a store read returns
// without data.system; array indexes; a path that is not there) is left to the store, as
// before. Put is a no-op: there is nothing to remember that Get cannot find.
type dataCache struct {
	once sync.Once
	doc  ast.Object // nil when the store could not be read: every Get misses
}

// load reads the data document from the store once.
func (c *dataCache) load(store storage.Store) {
	c.once.Do(func() {
		ctx := context.Background()
		txn, err := store.NewTransaction(ctx)
		if err != nil {
			return
		}
		defer store.Abort(ctx, txn)
		v, err := store.Read(ctx, txn, storage.RootPath)
		if err != nil {
			return
		}
		c.doc, _ = v.(ast.Object)
	})
}

// Get implements topdown.BaseCache.
func (c *dataCache) Get(ref ast.Ref) ast.Value {
	if c.doc == nil || len(ref) < 2 {
		return nil
	}
	var v ast.Value = c.doc
	for _, k := range ref[1:] {
		if _, ok := k.Value.(ast.String); !ok {
			return nil
		}
		obj, ok := v.(ast.Object)
		if !ok {
			return nil
		}
		t := obj.Get(k)
		if t == nil {
			return nil
		}
		v = t.Value
	}
	return v
}

// Put implements topdown.BaseCache.
func (*dataCache) Put(ast.Ref, ast.Value) {}
