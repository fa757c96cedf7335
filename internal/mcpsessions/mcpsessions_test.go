package mcpsessions_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/test/redistest"
)

// topologies are the Redis deployments replicas share sessions through: one server, and a
// Cluster (each session's keys hash to one slot; the event log's transaction must stay on it).
func topologies(t *testing.T) map[string]redis.UniversalClient {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	return map[string]redis.UniversalClient{"single": srv.Client(t), "cluster": cluster.Client(t)}
}

func record() mcpsessions.Record {
	return mcpsessions.Record{Peer: "127.0.0.2", ProtocolVersion: "2025-06-18", Initialized: true,
		ClientInfo: mcp.Implementation{Name: "agent", Version: "1.2"},
		Capabilities: mcp.ClientCapabilities{Sampling: &mcp.SamplingCapability{}, Roots: &struct {
			ListChanged bool `json:"listChanged,omitempty"`
		}{ListChanged: true}}}
}

// TestSessionRecordsAcrossReplicas plays two replicas on one Redis: what one stores the other
// reads whole; the record lives for its idle timeout, a refresh extends it, and a termination
// ends it for every replica while telling them it was ended, not lost.
func TestSessionRecordsAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	for name, client := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			a := mcpsessions.NewRedis(client, "sg:"+name+":", time.Second)
			b := mcpsessions.NewRedis(client, "sg:"+name+":", time.Second)
			key := "sg:" + name + ":mcp-session:s1"

			_, found, err := b.Get(ctx, "s1")
			require.NoError(t, err)
			assert.False(t, found, "no record yet")
			st, err := b.Refresh(ctx, "s1", time.Minute)
			require.NoError(t, err)
			assert.Equal(t, mcpsessions.Missing, st)

			require.NoError(t, a.Put(ctx, "s1", record(), 10*time.Second))
			got, found, err := b.Get(ctx, "s1")
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, record(), got, "every field survives the round trip")
			ttl := client.PTTL(ctx, key).Val()
			assert.True(t, ttl > 0 && ttl <= 10*time.Second, "the record expires with the idle timeout: %v", ttl)

			st, err = b.Refresh(ctx, "s1", time.Hour)
			require.NoError(t, err)
			assert.Equal(t, mcpsessions.Live, st)
			assert.Greater(t, client.PTTL(ctx, key).Val(), 10*time.Second, "a refresh extends the record")

			require.NoError(t, a.Terminate(ctx, "s1", 30*time.Second))
			_, found, err = b.Get(ctx, "s1")
			require.NoError(t, err)
			assert.False(t, found, "a terminated session is no session")
			st, err = b.Refresh(ctx, "s1", time.Hour)
			require.NoError(t, err)
			assert.Equal(t, mcpsessions.Terminated, st, "and every replica learns it was ended")
			ttl = client.PTTL(ctx, key).Val()
			assert.True(t, ttl > 0 && ttl <= 30*time.Second, "the marker is kept for its ttl, not extended: %v", ttl)

			other := mcpsessions.NewRedis(client, "other:", time.Second)
			require.NoError(t, a.Put(ctx, "s2", record(), time.Minute))
			_, found, err = other.Get(ctx, "s2")
			require.NoError(t, err)
			assert.False(t, found, "another key prefix is another deployment")
		})
	}
}

// TestACorruptRecordIsAnError stores bytes that are no record: Get says so instead of handing a
// zero record (no peer) to a replica.
func TestACorruptRecordIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, client.Set(ctx, "sg:mcp-session:bad", "{not json", time.Minute).Err())
	_, found, err := mcpsessions.NewRedis(client, "sg:", time.Second).Get(ctx, "bad")
	assert.False(t, found)
	assert.ErrorContains(t, err, "decode mcp session bad")
}

// TestEventLogResumesAStreamOnAnotherReplica appends the events of two streams of one session,
// as the replica serving it writes them, and reads them back from another: the events after a
// given ID on that ID's stream, in order; an ID trimmed off or never written is not found; a
// purge empties the log.
func TestEventLogResumesAStreamOnAnotherReplica(t *testing.T) {
	ctx := context.Background()
	for name, client := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			w := mcpsessions.NewRedis(client, "sg:", time.Second)
			r := mcpsessions.NewRedis(client, "sg:", time.Second)
			ev := func(id, stream string) mcpsessions.Event {
				return mcpsessions.Event{ID: id, Stream: stream, Message: json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"id":"` + id + `"}}`)}
			}
			for _, e := range []mcpsessions.Event{ev("1", "get"), ev("2", "post-7"), ev("3", "get"), ev("4", "post-7"), ev("5", "get")} {
				require.NoError(t, w.AppendEvent(ctx, "s1", e, 4, time.Minute))
			}
			stream, after, found, err := r.EventsAfter(ctx, "s1", "3")
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, "get", stream)
			assert.Equal(t, []mcpsessions.Event{ev("5", "get")}, after, "only that stream's later events")

			stream, after, found, err = r.EventsAfter(ctx, "s1", "2")
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, "post-7", stream)
			assert.Equal(t, []mcpsessions.Event{ev("4", "post-7")}, after)

			_, _, found, err = r.EventsAfter(ctx, "s1", "1")
			require.NoError(t, err)
			assert.False(t, found, "the oldest event was trimmed (keep 4)")
			_, _, found, err = r.EventsAfter(ctx, "s1", "99")
			require.NoError(t, err)
			assert.False(t, found)

			ttl := client.PTTL(ctx, "sg:mcp-events:s1").Val()
			assert.True(t, ttl > 0 && ttl <= time.Minute, "the log expires with the session: %v", ttl)
			require.NoError(t, w.PurgeEvents(ctx, "s1"))
			_, _, found, err = r.EventsAfter(ctx, "s1", "5")
			require.NoError(t, err)
			assert.False(t, found, "purged")
		})
	}
}

// TestEventLogSkipsAnEntryItCannotRead puts a line that is no event among the log's: the reader
// skips it and still finds the events around it.
func TestEventLogSkipsAnEntryItCannotRead(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	s := mcpsessions.NewRedis(client, "sg:", time.Second)
	require.NoError(t, s.AppendEvent(ctx, "s1", mcpsessions.Event{ID: "1", Stream: "get", Message: json.RawMessage(`{}`)}, 10, time.Minute))
	require.NoError(t, client.RPush(ctx, "sg:mcp-events:s1", "garbage").Err())
	require.NoError(t, s.AppendEvent(ctx, "s1", mcpsessions.Event{ID: "2", Stream: "get", Message: json.RawMessage(`{}`)}, 10, time.Minute))
	_, after, found, err := s.EventsAfter(ctx, "s1", "1")
	require.NoError(t, err)
	require.True(t, found)
	require.Len(t, after, 1)
	assert.Equal(t, "2", after[0].ID)
}

// TestRedisOutageIsBoundedAndNamed pauses Redis: every call returns an error that says what it
// was doing, within its timeout rather than hanging the request that made it.
func TestRedisOutageIsBoundedAndNamed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	s := mcpsessions.NewRedis(client, "sg:", 100*time.Millisecond)
	ctx := context.Background()
	require.NoError(t, s.Put(ctx, "s1", record(), time.Minute))
	srv.Pause()
	defer srv.Resume()
	for what, call := range map[string]func() error{
		"store mcp session in redis":     func() error { return s.Put(ctx, "s1", record(), time.Minute) },
		"read mcp session from redis":    func() error { _, _, err := s.Get(ctx, "s1"); return err },
		"refresh mcp session in redis":   func() error { _, err := s.Refresh(ctx, "s1", time.Minute); return err },
		"terminate mcp session in redis": func() error { return s.Terminate(ctx, "s1", time.Minute) },
		"append mcp event in redis": func() error {
			return s.AppendEvent(ctx, "s1", mcpsessions.Event{ID: "1", Message: json.RawMessage(`{}`)}, 10, time.Minute)
		},
		"read mcp events from redis": func() error { _, _, _, err := s.EventsAfter(ctx, "s1", "1"); return err },
		"purge mcp events in redis":  func() error { return s.PurgeEvents(ctx, "s1") },
	} {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			assert.ErrorContains(t, err, what)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not return while Redis was paused", what)
		}
	}
}
