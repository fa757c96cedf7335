package mcpsessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Event is one SSE event of a session's stream: its ID, the stream it belongs to, and the
// JSON-RPC message it carries.
type Event struct {
	ID      string          `json:"id"`
	Stream  string          `json:"stream"`
	Message json.RawMessage `json:"message"`
}

// EventLog shares the recent SSE events of sessions between replicas, so that a client whose
// stream broke can resume it (Last-Event-ID) on a replica other than the one that wrote it.
type EventLog interface {
	// AppendEvent adds e to the session's log, keeping the last keep events, for ttl.
	AppendEvent(ctx context.Context, session string, e Event, keep int, ttl time.Duration) error
	// EventsAfter returns the stream of event id and the events after it on that stream; found
	// is false when the log has no event id (never written, trimmed or expired).
	EventsAfter(ctx context.Context, session, id string) (stream string, after []Event, found bool, err error)
	// PurgeEvents drops the session's log.
	PurgeEvents(ctx context.Context, session string) error
}

var _ EventLog = (*Redis)(nil)

func (s *Redis) eventsKey(session string) string { return s.prefix + "mcp-events:" + session }

// AppendEvent implements EventLog: a Redis list per session, trimmed and expiring with it.
func (s *Redis) AppendEvent(ctx context.Context, session string, e Event, keep int, ttl time.Duration) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode mcp event: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.eventsKey(session)
	_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, key, b)
		p.LTrim(ctx, key, int64(-keep), -1)
		p.PExpire(ctx, key, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("append mcp event in redis: %w", err)
	}
	return nil
}

// EventsAfter implements EventLog.
func (s *Redis) EventsAfter(ctx context.Context, session, id string) (string, []Event, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	items, err := s.client.LRange(ctx, s.eventsKey(session), 0, -1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", nil, false, fmt.Errorf("read mcp events from redis: %w", err)
	}
	var stream string
	var after []Event
	found := false
	for _, it := range items {
		var e Event
		if json.Unmarshal([]byte(it), &e) != nil {
			continue
		}
		switch {
		case !found && e.ID == id:
			found, stream = true, e.Stream
		case found && e.Stream == stream:
			after = append(after, e)
		}
	}
	return stream, after, found, nil
}

// PurgeEvents implements EventLog.
func (s *Redis) PurgeEvents(ctx context.Context, session string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.Del(ctx, s.eventsKey(session)).Err(); err != nil {
		return fmt.Errorf("purge mcp events in redis: %w", err)
	}
	return nil
}
