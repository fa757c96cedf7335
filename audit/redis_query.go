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

// QueryRedis reads the audit stream (the events of every replica mirrored by StreamMirror) and
// returns the newest matches of f by event time, oldest first, like Query. Entries repeated by the
// mirror's at-least-once delivery are counted once (by event ID). It holds the IDs of the stream's
// entries and Limit events in memory; the stream is bounded by its MAXLEN.
func QueryRedis(ctx context.Context, client redis.UniversalClient, stream string, f Filter) (*QueryResult, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("query audit stream: %w", err)
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	res := &QueryResult{}
	keep := &newestByTime{limit: limit}
	seen := map[string]struct{}{}
	start := "-"
	for {
		msgs, err := client.XRangeN(ctx, stream, start, "+", queryPage).Result()
		if err != nil {
			return nil, fmt.Errorf("query audit stream %s: %w", stream, err)
		}
		for _, msg := range msgs {
			line, _ := msg.Values[StreamFieldLine].(string)
			ev, err := ParseLine([]byte(line))
			if err != nil {
				res.Malformed++
				continue
			}
			if isRecordKind(ev.Kind) {
				continue // mirrored checkpoints and chain records are not calls
			}
			if _, dup := seen[ev.ID]; dup {
				continue
			}
			seen[ev.ID] = struct{}{}
			if f.Match(&ev) {
				res.Matched++
				keep.add(ev)
			}
		}
		if len(msgs) < queryPage {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	res.Events = keep.inOrder()
	return res, nil
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
