package catalogs_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/catalogs"
	"github.com/sandgate/sandgate/test/redistest"
)

type store interface {
	Load(ctx context.Context, upstream string) ([]byte, error)
	Save(ctx context.Context, upstream string, b []byte) error
}

// Each store returns what was saved per upstream, nothing for an upstream never saved, and the
// newest save; the File store survives its process (a new File on the same path reads it).
func TestStoresKeepTheLastCatalogPerUpstream(t *testing.T) {
	path := filepath.Join(t.TempDir(), catalogs.FileName)
	srv := redistest.Start(t)
	for name, pair := range map[string][2]store{
		"file":  {catalogs.NewFile(path), catalogs.NewFile(path)},
		"redis": {catalogs.NewRedis(srv.Client(t), "t:", time.Second), catalogs.NewRedis(srv.Client(t), "t:", time.Second)},
	} {
		t.Run(name, func(t *testing.T) {
			w, r := pair[0], pair[1]
			ctx := t.Context()
			got, err := r.Load(ctx, "github")
			require.NoError(t, err)
			assert.Nil(t, got)
			require.NoError(t, w.Save(ctx, "github", []byte(`{"v":1}`)))
			require.NoError(t, w.Save(ctx, "jira", []byte(`{"v":2}`)))
			require.NoError(t, w.Save(ctx, "github", []byte(`{"v":3}`)))
			got, err = r.Load(ctx, "github")
			require.NoError(t, err)
			assert.JSONEq(t, `{"v":3}`, string(got))
			got, err = r.Load(ctx, "jira")
			require.NoError(t, err)
			assert.JSONEq(t, `{"v":2}`, string(got))
		})
	}
}

// A file larger than MaxSize is refused when read back, not read whole.
func TestFileStoreBoundsItsRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), catalogs.FileName)
	require.NoError(t, os.WriteFile(path, []byte(`{"a":"`+strings.Repeat("x", catalogs.MaxSize)+`"}`), 0o600))
	_, err := catalogs.NewFile(path).Load(t.Context(), "a")
	require.ErrorContains(t, err, "larger than")
}
