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

// prepared is one target's clients for one cell, connected and warmed up, and what they
// recorded so far.
type prepared struct {
	t       *Target
	cell    Cell
	clients []requester
	seq     atomic.Int64
	rec     *recorder
}

// prepare connects a client per sandbox (or per closed-loop client) of cell to t, warms every
// one up, and runs the warm-up load.
func (rn *runner) prepare(ctx context.Context, t *Target, cell Cell) (*prepared, error) {
	n := cell.Sandboxes
	if cell.Shape == ShapeClosed {
		n = cell.Concurrency
	}
	p := &prepared{t: t, cell: cell, clients: make([]requester, 0, n), rec: &recorder{h: NewHistogram()}}
	for i := range n {
		c, err := newRequester(rn.env, t, cell.Workload, i)
		if err != nil {
			p.close()
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	// Warm-up: every sandbox connects (and opens its MCP session) before the window.
	var werr atomic.Value
	parallel(ctx, len(p.clients), 64, func(i int) {
		var err error
		if w, ok := p.clients[i].(interface{ Warm(context.Context) error }); ok {
			err = w.Warm(ctx)
		} else {
			err = p.clients[i].Do(ctx, i)
		}
		if err != nil {
			werr.CompareAndSwap(nil, err.Error())
		}
	})
	if msg, ok := werr.Load().(string); ok {
		p.rec.firstErr.Store("warm-up: " + msg)
	}
	if rn.warmup > 0 {
		rn.load(ctx, cell, p.clients, rn.warmup, &p.seq, &recorder{h: NewHistogram()})
	}
	return p, nil
}

func (p *prepared) close() {
	parallel(context.Background(), len(p.clients), 64, func(i int) { p.clients[i].Close() })
}

// run measures one repetition of cell through t for d.
func (rn *runner) run(ctx context.Context, t *Target, cell Cell, d time.Duration, rep int) (Result, error) {
	p, err := rn.prepare(ctx, t, cell)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	t.ResetPeak()
	return p.result(rep, rn.measure(ctx, p, d, cellWindow)), nil
}

// runSliced measures one repetition of a slot's closed-loop cells (one per target, in the
// order given) together: the window of d of each is cut into slices of about slice, and the
// targets take turns slice by slice, in the given order and then in reverse (A B C C B A …), so
// that the machine's drifts within the repetition hit every target alike. Each target's figures
// sum its slices. Cells measured seconds apart differ by ±15% in CPU per request on a shared
// 2-core box, same binary and config on both sides; slices of 0.5 s cut the difference between
// two targets from the seconds-long drifts of the host (bench/README.md, "Workloads and shapes").
func (rn *runner) runSliced(ctx context.Context, targets []*Target, cells []Cell, d, slice time.Duration, rep int) ([]Result, error) {
	ps := make([]*prepared, 0, len(cells))
	defer func() {
		for _, p := range ps {
			p.close()
		}
	}()
	for i, c := range cells {
		p, err := rn.prepare(ctx, targets[i], c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		ps = append(ps, p)
		targets[i].ResetPeak()
	}
	n := max(1, int((d+slice/2)/slice))
	wins := make([]window, len(ps))
	for i, round := range sliceOrder(n, len(ps)) {
		for _, j := range round {
			shape := sliceWindow
			shape.sample = i == n-1
			wins[j] = wins[j].plus(rn.measure(ctx, ps[j], d/time.Duration(n), shape))
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	out := make([]Result, len(ps))
	for j, p := range ps {
		out[j] = p.result(rep, wins[j])
	}
	return out, nil
}

// sliceOrder is the order in which k targets take n turns each: round i is every target once,
// in order on even rounds and in reverse on odd ones (A B C C B A A B C …), so that no target
// always follows the same one, and each pair of rounds measures every target once before and
// once after each other.
func sliceOrder(n, k int) [][]int {
	rounds := make([][]int, n)
	for i := range rounds {
		rounds[i] = make([]int, k)
		for x := range k {
			rounds[i][x] = x
			if i%2 == 1 {
				rounds[i][x] = k - 1 - x
			}
		}
	}
	return rounds
}

// result is the Result of p's cell over the window w.
func (p *prepared) result(rep int, w window) Result {
	rec := p.rec
	res := Result{Cell: p.cell, Rep: rep, Requests: w.requests, Errors: rec.errs.Load(), Seconds: w.seconds,
		P50MS: ms(rec.h.Quantile(0.50)), P90MS: ms(rec.h.Quantile(0.90)), P99MS: ms(rec.h.Quantile(0.99)),
		UpstreamOpened: w.up.Opened, UpstreamPeak: w.up.Peak, TLSHandshakes: w.up.Handshakes,
		Goroutines: w.goroutines}
	if w.seconds > 0 {
		res.Throughput, res.LoadgenCores = float64(w.requests)/w.seconds, w.loadgenCPU.Seconds()/w.seconds
	}
	if s, ok := rec.firstErr.Load().(string); ok {
		res.FirstError = s
	}
	if w.requests > 0 {
		res.UpstreamCPUPerReqUS = us(w.upstreamCPU) / float64(w.requests)
		if p.t.proc != nil {
			res.CPUPerReqUS = us(w.targetCPU) / float64(w.requests)
			res.RSSBytes, res.PeakRSSBytes, res.Files, res.Threads = w.proc.RSS, w.proc.PeakRSS, w.proc.Files, w.proc.Threads
		}
	}
	return res
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

// plus is w and v summed: two slices of one target's window.
func (w window) plus(v window) window {
	w.seconds += v.seconds
	w.requests += v.requests
	w.targetCPU, w.loadgenCPU, w.upstreamCPU = w.targetCPU+v.targetCPU, w.loadgenCPU+v.loadgenCPU, w.upstreamCPU+v.upstreamCPU
	w.up.Opened, w.up.Handshakes, w.up.Peak = w.up.Opened+v.up.Opened, w.up.Handshakes+v.up.Handshakes, max(w.up.Peak, v.up.Peak)
	if v.proc != (ProcSample{}) {
		w.proc, w.goroutines = v.proc, v.goroutines
	}
	return w
}

// windowShape is where a window's two samples fall in its load.
type windowShape struct {
	// lead is how long the load runs before the first sample; with ramp set, the first sample
	// also waits (up to lead) until as many requests completed as the cell has clients, so
	// that every closed-loop client is in its steady cycle.
	lead time.Duration
	ramp bool
	tail time.Duration // how long the load runs past the last sample
	// sample reads the target's RSS, files, threads and goroutines near the window's end
	// (a /metrics request to it: once per cell, not per slice).
	sample bool
}

var (
	cellWindow  = windowShape{lead: 100 * time.Millisecond, tail: 100 * time.Millisecond, sample: true}
	sliceWindow = windowShape{lead: 500 * time.Millisecond, ramp: true, tail: 20 * time.Millisecond}
)

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

// measure runs p's load for d plus a margin and samples CPU and completed requests at two
// moments inside it: the window opens once the load has run shape.lead (or, with shape.ramp,
// once every client completed a request) and closes d later, shape.tail before the clients
// stop. Requests in flight at either end are in the steady state on both sides, so CPU and
// requests cover the same interval (the old way read CPU 50 ms before the end and divided by
// the requests of the whole run).
func (rn *runner) measure(ctx context.Context, p *prepared, d time.Duration, shape windowShape) window {
	t, rec := p.t, p.rec
	var w window
	var s0, s1 cpuSample
	var up0 UpstreamCounts
	started := rec.okN.Load()
	stop := make(chan struct{}) // closed when the window's last sample is taken
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		defer close(stop)
		if !rn.lead(ctx, shape, rec, started, int64(len(p.clients))) {
			return
		}
		up0 = rn.env.up.ModelCounts()
		s0 = rn.cpuNow(t, &rec.okN)
		if shape.sample {
			if !sleepCtx(ctx, d-50*time.Millisecond) {
				return
			}
			if t.proc != nil {
				w.proc, _ = t.Sample()
			}
			w.goroutines = goroutines(t)
		}
		if !sleepCtx(ctx, time.Until(s0.at.Add(d))) {
			return
		}
		s1 = rn.cpuNow(t, &rec.okN)
		up1 := rn.env.up.ModelCounts()
		w.up = UpstreamCounts{Opened: up1.Opened - up0.Opened, Handshakes: up1.Handshakes - up0.Handshakes, Peak: up1.Peak}
	}()
	rn.loadUntil(ctx, p.cell, p.clients, shape.lead+d+shape.tail, stop, shape.tail, &p.seq, rec)
	<-sampled
	if s1.at.IsZero() {
		return window{seconds: d.Seconds()}
	}
	w.seconds = s1.at.Sub(s0.at).Seconds()
	w.requests = s1.done - s0.done
	w.targetCPU, w.loadgenCPU, w.upstreamCPU = s1.target-s0.target, s1.loadgen-s0.loadgen, s1.upstreams-s0.upstreams
	return w
}

// lead waits until the window may open: shape.lead, or with shape.ramp until clients requests
// completed since started (at most shape.lead). It reports whether ctx is still live.
func (rn *runner) lead(ctx context.Context, shape windowShape, rec *recorder, started, clients int64) bool {
	if !shape.ramp {
		return sleepCtx(ctx, shape.lead)
	}
	deadline := time.Now().Add(shape.lead)
	for rec.okN.Load()-started < clients && time.Now().Before(deadline) {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			return false
		}
	}
	return ctx.Err() == nil
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
	return rn.loadUntil(ctx, cell, clients, d, nil, 0, seq, rec)
}

// loadUntil is load, except that a closed loop also stops tail after stop is closed (a window
// whose first sample waited for its clients' ramp ends later than d foresaw, or sooner).
func (rn *runner) loadUntil(ctx context.Context, cell Cell, clients []requester, d time.Duration, stop <-chan struct{}, tail time.Duration, seq *atomic.Int64, rec *recorder) int64 {
	ctx, cancel := context.WithTimeout(ctx, d+rn.env.timeout)
	defer cancel()
	end := time.Now().Add(d)
	var okCount atomic.Int64
	var wg sync.WaitGroup
	if cell.Shape == ShapeClosed {
		var ended atomic.Bool // at d, or tail after stop
		go func() {
			if stop == nil {
				sleepCtx(ctx, d)
			} else {
				select {
				case <-stop:
					sleepCtx(ctx, tail)
				case <-ctx.Done():
				}
			}
			ended.Store(true)
		}()
		for _, c := range clients {
			wg.Go(func() {
				for !ended.Load() && ctx.Err() == nil {
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
