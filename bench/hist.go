package bench

import (
	"math"
	"sort"
	"time"
)

// Histogram records durations in log-spaced buckets (about 1% relative error) from 1µs to
// about 100s. The zero value is not usable; use NewHistogram. Not safe for concurrent use:
// each worker keeps its own and they are merged.
type Histogram struct {
	counts []uint64
	n      uint64
	max    time.Duration
}

const (
	histMin    = float64(time.Microsecond)
	histGrowth = 1.02 // bucket width: 2%, so the bucket midpoint is within 1%
)

var histBuckets = int(math.Ceil(math.Log(float64(100*time.Second)/histMin)/math.Log(histGrowth))) + 1

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return &Histogram{counts: make([]uint64, histBuckets)} }

func histIndex(d time.Duration) int {
	if float64(d) <= histMin {
		return 0
	}
	i := int(math.Log(float64(d)/histMin) / math.Log(histGrowth))
	return min(i+1, histBuckets-1)
}

// Record adds one value.
func (h *Histogram) Record(d time.Duration) {
	h.counts[histIndex(d)]++
	h.n++
	h.max = max(h.max, d)
}

// Merge adds o's values.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the value at q (0..1): the midpoint of the bucket holding it.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == 0 {
				return time.Duration(histMin)
			}
			lo := histMin * math.Pow(histGrowth, float64(i-1))
			return min(time.Duration(lo*(1+histGrowth)/2), h.max)
		}
	}
	return h.max
}

// median returns the median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
