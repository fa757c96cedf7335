package audit

import (
	"container/heap"
	"context"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"
)

// queryPage is how many stream entries one XRANGE reads.
const queryPage = 1000

// QueryRedis reads the audit streams under the base name stream (every replica's, listed in the
// registry, and the single stream of earlier versions; see ReplicaStream) and returns the newest
// matches of f by event time, oldest first, like Query. Entries repeated by the mirror's
// at-least-once delivery are counted once (by event ID). It holds the IDs of the streams' entries
// and Limit events in memory; each stream is bounded by its MAXLEN.
func QueryRedis(ctx context.Context, client redis.UniversalClient, stream string, f Filter) (*QueryResult, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("query audit stream: %w", err)
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	streams, err := Streams(ctx, client, stream)
	if err != nil {
		return nil, fmt.Errorf("query audit stream: %w", err)
	}
	q := &streamQuery{f: f, res: &QueryResult{}, keep: &newestByTime{limit: limit}, seen: map[string]struct{}{}}
	for _, key := range streams {
		if err := q.read(ctx, client, key); err != nil {
			return nil, err
		}
	}
	q.res.Events = q.keep.inOrder()
	return q.res, nil
}

// streamQuery gathers the matches of f over several streams.
type streamQuery struct {
	f    Filter
	res  *QueryResult
	keep *newestByTime
	seen map[string]struct{}
}

// read pages through one stream (absent: nothing to read).
func (q *streamQuery) read(ctx context.Context, client redis.UniversalClient, stream string) error {
	start := "-"
	for {
		msgs, err := client.XRangeN(ctx, stream, start, "+", queryPage).Result()
		if err != nil {
			return fmt.Errorf("query audit stream %s: %w", stream, err)
		}
		for _, msg := range msgs {
			q.add(msg)
		}
		if len(msgs) < queryPage {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

func (q *streamQuery) add(msg redis.XMessage) {
	line, _ := msg.Values[StreamFieldLine].(string)
	ev, err := ParseLine([]byte(line))
	if err != nil {
		q.res.Malformed++
		return
	}
	if isRecordKind(ev.Kind) {
		return // mirrored checkpoints and chain records are not calls
	}
	if _, dup := q.seen[ev.ID]; dup {
		return
	}
	q.seen[ev.ID] = struct{}{}
	if q.f.Match(&ev) {
		q.res.Matched++
		q.keep.add(ev)
	}
}

// newestByTime keeps the limit newest events by Time (all when limit < 0): the stream is in
// mirroring order, which differs from event order after a replica catches up.
type newestByTime struct {
	limit int
	h     eventHeap
}

func (k *newestByTime) add(ev Event) {
	if k.limit < 0 || len(k.h) < k.limit {
		heap.Push(&k.h, ev)
		return
	}
	if ev.Time.After(k.h[0].Time) {
		k.h[0] = ev
		heap.Fix(&k.h, 0)
	}
}

func (k *newestByTime) inOrder() []Event {
	out := []Event(k.h)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// eventHeap is a min-heap by Time.
type eventHeap []Event

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].Time.Before(h[j].Time) }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(Event)) }
func (h *eventHeap) Pop() any {
	old := *h
	ev := old[len(old)-1]
	*h = old[:len(old)-1]
	return ev
}
