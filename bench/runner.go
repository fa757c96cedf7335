package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Shapes of load.
const (
	ShapeRate   = "rate"   // fixed offered rate, open loop
	ShapeClosed = "closed" // closed loop, fixed concurrency
)

// Cell is one measurement: a workload through a target under one load shape.
type Cell struct {
	Workload    string  `json:"workload"`
	Target      string  `json:"target"`
	Shape       string  `json:"shape"`
	Sandboxes   int     `json:"sandboxes"`
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
}

func (c Cell) String() string {
	if c.Shape == ShapeRate {
		return fmt.Sprintf("%s/%s rate %.0f/s over %d sandboxes", c.Workload, c.Target, c.Rate, c.Sandboxes)
	}
	return fmt.Sprintf("%s/%s closed c=%d", c.Workload, c.Target, c.Concurrency)
}

// Result is one repetition of a cell.
type Result struct {
	Cell
	Rep            int     `json:"rep"`
	Requests       int64   `json:"requests"`
	Errors         int64   `json:"errors"`
	FirstError     string  `json:"first_error,omitempty"`
	Seconds        float64 `json:"seconds"`
	Throughput     float64 `json:"throughput_rps"`
	P50MS          float64 `json:"p50_ms"`
	P90MS          float64 `json:"p90_ms"`
	P99MS          float64 `json:"p99_ms"`
	CPUPerReqUS    float64 `json:"cpu_us_per_req,omitempty"`
	RSSBytes       int64   `json:"rss_bytes,omitempty"`
	PeakRSSBytes   int64   `json:"peak_rss_bytes,omitempty"`
	Files          int     `json:"open_files,omitempty"`
	Threads        int     `json:"threads,omitempty"`
	Goroutines     int     `json:"goroutines,omitempty"`
	UpstreamOpened int64   `json:"upstream_conns_opened"`
	UpstreamPeak   int64   `json:"upstream_conns_peak"`
	TLSHandshakes  int64   `json:"upstream_tls_handshakes"`
}

// runner runs cells against the targets.
type runner struct {
	env      *clientEnv
	warmup   time.Duration
	progress func(string)
}

// recorder collects latencies from many goroutines.
type recorder struct {
	mu       sync.Mutex
	h        *Histogram
	errs     atomic.Int64
	firstErr atomic.Value
}

func (r *recorder) ok(d time.Duration) {
	r.mu.Lock()
	r.h.Record(d)
	r.mu.Unlock()
}

func (r *recorder) fail(err error) {
	r.errs.Add(1)
	r.firstErr.CompareAndSwap(nil, err.Error())
}

// run measures one repetition of cell through t for d.
func (rn *runner) run(ctx context.Context, t *Target, cell Cell, d time.Duration, rep int) (Result, error) {
	n := cell.Sandboxes
	if cell.Shape == ShapeClosed {
		n = cell.Concurrency
	}
	clients := make([]requester, n)
	for i := range clients {
		c, err := newRequester(rn.env, t, cell.Workload, i)
		if err != nil {
			return Result{}, err
		}
		clients[i] = c
	}
	defer parallel(context.Background(), len(clients), 64, func(i int) { clients[i].Close() })
	// Warm-up: every sandbox connects (and opens its MCP session) before the window.
	var werr atomic.Value
	parallel(ctx, len(clients), 64, func(i int) {
		var err error
		if w, ok := clients[i].(interface{ Warm(context.Context) error }); ok {
			err = w.Warm(ctx)
		} else {
			err = clients[i].Do(ctx, i)
		}
		if err != nil {
			werr.CompareAndSwap(nil, err.Error())
		}
	})
	rec := &recorder{h: NewHistogram()}
	if msg, ok := werr.Load().(string); ok {
		rec.firstErr.Store("warm-up: " + msg)
	}
	var seq atomic.Int64
	if rn.warmup > 0 {
		rn.load(ctx, cell, clients, rn.warmup, &seq, &recorder{h: NewHistogram()})
	}
	before, _ := t.Sample()
	t.ResetPeak()
	upBefore := rn.env.up.ModelCounts()
	start := time.Now()
	var after ProcSample
	var gor int
	stopSample := make(chan struct{})
	go func() {
		defer close(stopSample)
		select {
		case <-ctx.Done():
		case <-time.After(d - 50*time.Millisecond): // while the load still runs
		}
		after, _ = t.Sample()
		gor = goroutines(t)
	}()
	done := rn.load(ctx, cell, clients, d, &seq, rec)
	<-stopSample
	elapsed := time.Since(start).Seconds()
	upAfter := rn.env.up.ModelCounts()
	res := Result{Cell: cell, Rep: rep, Requests: done, Errors: rec.errs.Load(), Seconds: elapsed,
		Throughput: float64(done) / elapsed,
		P50MS:      ms(rec.h.Quantile(0.50)), P90MS: ms(rec.h.Quantile(0.90)), P99MS: ms(rec.h.Quantile(0.99)),
		UpstreamOpened: upAfter.Opened - upBefore.Opened, UpstreamPeak: upAfter.Peak,
		TLSHandshakes: upAfter.Handshakes - upBefore.Handshakes, Goroutines: gor}
	if s, ok := rec.firstErr.Load().(string); ok {
		res.FirstError = s
	}
	if t.proc != nil && done > 0 {
		res.CPUPerReqUS = float64((after.CPU - before.CPU).Microseconds()) / float64(done)
		res.RSSBytes, res.PeakRSSBytes, res.Files, res.Threads = after.RSS, after.PeakRSS, after.Files, after.Threads
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// load drives the clients for d and returns the requests completed without error.
func (rn *runner) load(ctx context.Context, cell Cell, clients []requester, d time.Duration, seq *atomic.Int64, rec *recorder) int64 {
	ctx, cancel := context.WithTimeout(ctx, d+rn.env.timeout)
	defer cancel()
	end := time.Now().Add(d)
	var okCount atomic.Int64
	var wg sync.WaitGroup
	if cell.Shape == ShapeClosed {
		for _, c := range clients {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					t0 := time.Now()
					err := c.Do(ctx, int(seq.Add(1)))
					if err != nil {
						rec.fail(err)
						time.Sleep(time.Millisecond) // a failing target must not become a busy loop
						continue
					}
					rec.ok(time.Since(t0))
					okCount.Add(1)
				}
			})
		}
		wg.Wait()
		return okCount.Load()
	}
	// Open loop: request k is due at start + k/rate, on sandbox k mod N; latency counts from
	// the due time, so a stall shows up in every request it delayed (no coordinated omission).
	interval := time.Duration(float64(time.Second) / cell.Rate)
	start := time.Now()
	const maxInFlight = 8192
	var inFlight atomic.Int64
	for k := 0; ; k++ {
		due := start.Add(time.Duration(k) * interval)
		if !due.Before(end) || ctx.Err() != nil {
			break
		}
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		if inFlight.Load() >= maxInFlight {
			rec.fail(fmt.Errorf("more than %d requests in flight", maxInFlight))
			continue
		}
		inFlight.Add(1)
		c := clients[k%len(clients)]
		s := int(seq.Add(1))
		wg.Go(func() {
			defer inFlight.Add(-1)
			if err := c.Do(ctx, s); err != nil {
				rec.fail(err)
				return
			}
			rec.ok(time.Since(due))
			okCount.Add(1)
		})
	}
	wg.Wait()
	return okCount.Load()
}

// parallel runs f(0..n-1) on at most width goroutines.
func parallel(ctx context.Context, n, width int, f func(int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(width, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}

// goroutines reads go_goroutines from Sandgate's /metrics (0 for other targets).
func goroutines(t *Target) int {
	if t.Admin == "" {
		return 0
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + t.Admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n)
		}
	}
	return 0
}
