package credential

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/redisconn"
)

// RunEndNotices tell every replica that a run ended (its grant was deleted through one
// replica's admin API), over a Redis channel: each replica revokes its own tokens of the run.
// A message names the run's key and why; Redis never holds a token (nor keeps the message:
// a replica that was disconnected catches the change at the run's next call, whose scope no
// longer matches its token, or when the token expires). Claims and sandboxes that end are seen
// by every replica's own watch and need no notice.
type RunEndNotices struct {
	client  redis.UniversalClient
	channel string
	store   *Store
	log     *slog.Logger
}

type runEnd struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// NewRunEndNotices publishes and receives on the channel prefix + "credential:run-ends".
func NewRunEndNotices(client redis.UniversalClient, prefix string, store *Store, log *slog.Logger) *RunEndNotices {
	return &RunEndNotices{client: client, channel: prefix + "credential:run-ends", store: store, log: log}
}

// Publish tells the other replicas that the run of key ended.
func (n *RunEndNotices) Publish(key, reason string) {
	b, _ := json.Marshal(runEnd{Key: key, Reason: reason})
	ctx, cancel := context.WithTimeout(redisconn.Unguarded(context.Background()), 2*time.Second)
	defer cancel()
	if err := n.client.Publish(ctx, n.channel, b).Err(); err != nil {
		n.log.Warn("other replicas were not told a run ended; they notice at its next call", "run", key, "err", err)
	}
}

// Run receives notices until ctx ends, forgetting each run here too.
func (n *RunEndNotices) Run(ctx context.Context) {
	sub := n.client.Subscribe(redisconn.Unguarded(ctx), n.channel)
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			var e runEnd
			if json.Unmarshal([]byte(msg.Payload), &e) != nil || e.Key == "" || len(e.Reason) > 256 {
				continue
			}
			n.store.Forget(e.Key, e.Reason)
		}
	}
}
