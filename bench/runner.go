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
	Rep         int     `json:"rep"`
	Requests    int64   `json:"requests"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Seconds     float64 `json:"seconds"`
	Throughput  float64 `json:"throughput_rps"`
	P50MS       float64 `json:"p50_ms"`
	P90MS       float64 `json:"p90_ms"`
	P99MS       float64 `json:"p99_ms"`
	CPUPerReqUS float64 `json:"cpu_us_per_req,omitempty"`
	// The load generator's CPU in cores over the window (1.0 = one core busy): above
	// loadgenSaturated the cell may have measured the generator, not the target.
	LoadgenCores float64 `json:"loadgen_cores"`
	// The upstream stand-ins' CPU per request over the window.
	UpstreamCPUPerReqUS float64 `json:"upstream_cpu_us_per_req,omitempty"`
	RSSBytes            int64   `json:"rss_bytes,omitempty"`
	PeakRSSBytes        int64   `json:"peak_rss_bytes,omitempty"`
	Files               int     `json:"open_files,omitempty"`
	Threads             int     `json:"threads,omitempty"`
	Goroutines          int     `json:"goroutines,omitempty"`
	UpstreamOpened      int64   `json:"upstream_conns_opened"`
	UpstreamPeak        int64   `json:"upstream_conns_peak"`
	TLSHandshakes       int64   `json:"upstream_tls_handshakes"`
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
	okN      atomic.Int64 // completed without error, read live by the window's samples
	errs     atomic.Int64
	firstErr atomic.Value
}

func (r *recorder) ok(d time.Duration) {
	r.mu.Lock()
	r.h.Record(d)
	r.mu.Unlock()
	r.okN.Add(1)
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
	t.ResetPeak()
	win := rn.measure(ctx, t, cell, clients, d, &seq, rec)
	res := Result{Cell: cell, Rep: rep, Requests: win.requests, Errors: rec.errs.Load(), Seconds: win.seconds,
		Throughput: float64(win.requests) / win.seconds,
		P50MS:      ms(rec.h.Quantile(0.50)), P90MS: ms(rec.h.Quantile(0.90)), P99MS: ms(rec.h.Quantile(0.99)),
		UpstreamOpened: win.up.Opened, UpstreamPeak: win.up.Peak, TLSHandshakes: win.up.Handshakes,
		Goroutines: win.goroutines, LoadgenCores: win.loadgenCPU.Seconds() / win.seconds}
	if s, ok := rec.firstErr.Load().(string); ok {
		res.FirstError = s
	}
	if win.requests > 0 {
		res.UpstreamCPUPerReqUS = us(win.upstreamCPU) / float64(win.requests)
		if t.proc != nil {
			res.CPUPerReqUS = us(win.targetCPU) / float64(win.requests)
			res.RSSBytes, res.PeakRSSBytes, res.Files, res.Threads = win.proc.RSS, win.proc.PeakRSS, win.proc.Files, win.proc.Threads
		}
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// window is what one measurement window saw: every figure is a difference between two
// samples taken at the window's two ends, while the load runs on both sides of each.
type window struct {
	seconds                            float64
	requests                           int64 // completed without error between the samples
	targetCPU, loadgenCPU, upstreamCPU time.Duration
	up                                 UpstreamCounts
	proc                               ProcSample // RSS, files, threads near the end
	goroutines                         int
}

// cpuSample is the CPU of every process a window measures, read at one moment.
type cpuSample struct {
	at                         time.Time
	done                       int64
	target, loadgen, upstreams time.Duration
}

func (rn *runner) cpuNow(t *Target, done *atomic.Int64) cpuSample {
	s := cpuSample{at: time.Now(), loadgen: selfCPU()}
	if t.proc != nil {
		s.target, _ = t.proc.meter.CPU()
	}
	if p := rn.env.up.proc; p != nil {
		s.upstreams, _ = p.meter.CPU()
	}
	s.done = done.Load()
	return s
}

// measure runs the load for d plus a margin and samples CPU and completed requests at two
// moments inside it: the window opens once the load has run windowLead and closes d later,
// before the clients stop. Requests in flight at either end are in the steady state on both
// sides, so CPU and requests cover the same interval (the old way read CPU 50 ms before the
// end and divided by the requests of the whole run).
func (rn *runner) measure(ctx context.Context, t *Target, cell Cell, clients []requester, d time.Duration, seq *atomic.Int64, rec *recorder) window {
	const windowLead, windowTail = 100 * time.Millisecond, 100 * time.Millisecond
	var w window
	var s0, s1 cpuSample
	var up0 UpstreamCounts
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if !sleepCtx(ctx, windowLead) {
			return
		}
		up0 = rn.env.up.ModelCounts()
		s0 = rn.cpuNow(t, &rec.okN)
		if !sleepCtx(ctx, d-50*time.Millisecond) {
			return
		}
		if t.proc != nil {
			w.proc, _ = t.Sample()
		}
		w.goroutines = goroutines(t)
		if !sleepCtx(ctx, time.Until(s0.at.Add(d))) {
			return
		}
		s1 = rn.cpuNow(t, &rec.okN)
		up1 := rn.env.up.ModelCounts()
		w.up = UpstreamCounts{Opened: up1.Opened - up0.Opened, Handshakes: up1.Handshakes - up0.Handshakes, Peak: up1.Peak}
	}()
	rn.load(ctx, cell, clients, windowLead+d+windowTail, seq, rec)
	<-sampled
	if s1.at.IsZero() {
		return window{seconds: d.Seconds()}
	}
	w.seconds = s1.at.Sub(s0.at).Seconds()
	w.requests = s1.done - s0.done
	w.targetCPU, w.loadgenCPU, w.upstreamCPU = s1.target-s0.target, s1.loadgen-s0.loadgen, s1.upstreams-s0.upstreams
	return w
}

// sleepCtx sleeps d, or less when ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	return ctx.Err() == nil
}

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
