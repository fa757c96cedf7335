package audit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Each replica mirrors its log to a stream of its own, so that in a Redis Cluster the replicas'
// streams spread over the shards (the replica's name is the hash tag) and no replica's appends
// wait on another's. A set, the registry, lists the streams; QueryRedis reads them all.
//
//	NAME:{REPLICA}            the stream of one replica (NAME is redis.audit_stream.name, braces removed)
//	NAME:{REPLICA}:mirrored   the hash of the replica's last mirrored line (same slot as its stream)
//	NAME:replicas             the registry: a set of the stream keys above
//	NAME                      the single stream of earlier versions, still read by QueryRedis

// ReplicaStream returns the stream key replica source mirrors to under the base name.
func ReplicaStream(name, source string) string {
	return untag(name) + ":{" + untag(source) + "}"
}

// RegistryKey returns the key of the set that lists the replicas' streams under name.
func RegistryKey(name string) string { return untag(name) + ":replicas" }

// untag removes hash-tag braces, so that a derived key has exactly one tag, the one it is given.
func untag(s string) string {
	return strings.NewReplacer("{", "", "}", "").Replace(s)
}

// registerEvery is how often a mirror adds its stream to the registry again: a registry lost with
// its Redis (a failover to a replica that had not received it) is restored within this time.
const registerEvery = time.Minute

// register adds the mirror's stream to the registry unless it did so in the last registerEvery.
func (m *StreamMirror) register(ctx context.Context) error {
	if time.Since(m.registered) < registerEvery {
		return nil
	}
	if err := m.client.SAdd(ctx, RegistryKey(m.cfg.Stream), m.stream).Err(); err != nil {
		return fmt.Errorf("audit stream mirror: register %s in %s: %w", m.stream, RegistryKey(m.cfg.Stream), err)
	}
	m.registered = time.Now()
	return nil
}

// Streams lists the audit streams under name: every replica's in the registry and the earlier
// single stream, sorted.
func Streams(ctx context.Context, client redis.UniversalClient, name string) ([]string, error) {
	keys, err := client.SMembers(ctx, RegistryKey(name)).Result()
	if err != nil {
		return nil, fmt.Errorf("list audit streams in %s: %w", RegistryKey(name), err)
	}
	sort.Strings(keys)
	return append(keys, name), nil
}
