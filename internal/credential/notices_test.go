package credential

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/redistest"
)

// A run ended through one replica (its grant deleted on that replica's admin API) ends on every
// replica: the notice over Redis names the run, each replica revokes its own token of it, and
// Redis never holds a token.
func TestARunEndedOnOneReplicaEndsOnEvery(t *testing.T) {
	srv := redistest.Start(t)
	one, _, _, _ := newTestMinter(t)
	two, p2, _, _ := newTestMinter(t)
	p2.revokeCh = make(chan string, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n1 := NewRunEndNotices(srv.Client(t), "sg:", one, one.log)
	n2 := NewRunEndNotices(srv.Client(t), "sg:", two, two.log)
	go n2.Run(ctx)

	run := runOf("agents/claims/a", "acme/widgets")
	l2, err := take(two, run)
	require.NoError(t, err)
	// The subscription is up once a notice published now is received: publish until it is.
	deadline := time.After(10 * time.Second)
	for {
		n1.Publish(run.Key, `its grant "github_repos" was deleted`)
		select {
		case revoked := <-p2.revokeCh:
			assert.Equal(t, l2.Value, revoked, "the other replica revoked its own token of the run")
			keys, err := srv.Client(t).Keys(ctx, "*").Result()
			require.NoError(t, err)
			assert.Empty(t, keys, "Redis keeps nothing: no token, no ID")
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("the other replica was not told")
		}
	}
}
