package policy_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

// The log says "last good revision keeps serving" only when there is one: a folder that does
// not compile at start leaves none, and said so wrongly before.
func TestARejectedLoadSaysWhetherARevisionServes(t *testing.T) {
	const broken = "package sandgate\n\ndecision := {\"allow\": \n"
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	ctx := context.Background()

	t.Run("at start there is none", func(t *testing.T) {
		log.Reset()
		dir := t.TempDir()
		writePolicy(t, dir, "p.rego", broken)
		_, err := policy.New(ctx, dir, policy.WithLogger(logger))
		require.Error(t, err)
		assert.Contains(t, log.String(), "no revision serves: every call is denied until the policies compile")
		assert.NotContains(t, log.String(), "last good revision")
	})
	t.Run("an empty folder at start has none either", func(t *testing.T) {
		log.Reset()
		e, err := policy.New(ctx, t.TempDir(), policy.WithLogger(logger))
		require.NoError(t, err)
		assert.Equal(t, "none", e.Revision())
		assert.Contains(t, log.String(), "no revision serves")
		assert.NotContains(t, log.String(), "last good revision")
	})
	t.Run("after a good load the last good revision keeps serving", func(t *testing.T) {
		dir := t.TempDir()
		writePolicy(t, dir, "p.rego", allowEcho)
		e, err := policy.New(ctx, dir, policy.WithLogger(logger))
		require.NoError(t, err)
		log.Reset()
		writePolicy(t, dir, "p.rego", broken)
		require.Error(t, e.Reload(ctx))
		assert.Contains(t, log.String(), "policy reload rejected; last good revision keeps serving")
		assert.Contains(t, log.String(), "revision="+e.Revision())
	})
}
