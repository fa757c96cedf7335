package audit

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	collogpb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// timer is one timer a Follower asked for: how long, and the channel the test fires.
type timer struct {
	d time.Duration
	c chan time.Time
}

// timers stands in for time.After in a Follower: each timer asked for is handed to the test,
// which decides when it fires. The follower waits until the test took it, so the order of
// timers and requests is the follower's own, whatever the machine's speed: no test here
// measures time.
type timers chan timer

func (ts timers) after(d time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	ts <- timer{d, c}
	return c
}

// step is one answer of a scripted Collector and the wait the exporter must then ask for.
type step struct {
	name string
	// http answers an OTLP/HTTP request; grpc an OTLP/gRPC one (nil: OK).
	http func(w http.ResponseWriter)
	grpc error
	wait time.Duration
}

// script hands out the answers of steps in order, one per request, and counts requests.
type script struct {
	mu    sync.Mutex
	steps []step
	n     int
}

func (s *script) next() step {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.steps[min(s.n, len(s.steps)-1)]
	s.n++
	return st
}

func (s *script) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func refuse(code int, retryAfter ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for _, v := range retryAfter {
			w.Header().Add("Retry-After", v)
		}
		http.Error(w, "busy", code)
	}
}

func throttle(code codes.Code, after time.Duration) error {
	st, err := status.New(code, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// TestOTLPExporterPacesAFailingCollector: a Collector that refuses gets the next attempt only
// when the exporter's back-off, or the wait it asked for (Retry-After on a 429 or 503, RetryInfo
// over gRPC), is over; audit writes in between (Notify) do not bring it forward, nor does the
// poll. The timers are the test's: each step counts the requests made against the timers fired.
func TestOTLPExporterPacesAFailingCollector(t *testing.T) {
	ok := step{name: "accepted", wait: time.Hour} // then the follower polls
	for _, tc := range []struct {
		name     string
		protocol string
		steps    []step
	}{
		{"OTLP/HTTP Retry-After", OTLPProtocolHTTP, []step{
			{name: "429, Retry-After in seconds", http: refuse(http.StatusTooManyRequests, "7"), wait: 7 * time.Second},
			{name: "503, Retry-After an HTTP date a century away: at most MaxThrottle", http: refuse(http.StatusServiceUnavailable, "Wed, 21 Oct 2126 07:28:00 GMT"), wait: MaxThrottle},
			{name: "503, Retry-After on two lines: the longer", http: refuse(http.StatusServiceUnavailable, "2", "9"), wait: 9 * time.Second},
			{name: "503, Retry-After shorter than the back-off: the back-off", http: refuse(http.StatusServiceUnavailable, "0"), wait: 800 * time.Millisecond},
			{name: "500 without Retry-After: the back-off", http: refuse(http.StatusInternalServerError), wait: 1600 * time.Millisecond},
			{name: "429 with a Retry-After that does not parse: the back-off", http: refuse(http.StatusTooManyRequests, "soon"), wait: 3200 * time.Millisecond},
			ok,
		}},
		{"OTLP/gRPC RetryInfo", OTLPProtocolGRPC, []step{
			{name: "RESOURCE_EXHAUSTED with RetryInfo", grpc: throttle(codes.ResourceExhausted, 7*time.Second), wait: 7 * time.Second},
			{name: "UNAVAILABLE with RetryInfo of an hour: at most MaxThrottle", grpc: throttle(codes.Unavailable, time.Hour), wait: MaxThrottle},
			{name: "UNAVAILABLE without RetryInfo: the back-off", grpc: status.Error(codes.Unavailable, "down"), wait: 400 * time.Millisecond},
			ok,
		}},
		{"a Collector that keeps failing: the documented back-off, 100 ms doubling to 5 s", OTLPProtocolHTTP, []step{
			{http: refuse(http.StatusBadGateway), wait: 100 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 200 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 400 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 800 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 1600 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 3200 * time.Millisecond},
			{http: refuse(http.StatusBadGateway), wait: 5 * time.Second},
			{http: refuse(http.StatusBadGateway), wait: 5 * time.Second},
			ok,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &script{steps: tc.steps}
			var endpoint string
			if tc.protocol == OTLPProtocolGRPC {
				rc := newSenderGRPCReceiver(t, nil, func(context.Context) (*collogpb.ExportLogsServiceResponse, error) {
					if err := sc.next().grpc; err != nil {
						return nil, err
					}
					return &collogpb.ExportLogsServiceResponse{}, nil
				})
				endpoint = "http://" + rc.addr()
			} else {
				rc := newSenderHTTPReceiver(t, nil, func(w http.ResponseWriter, _ *http.Request) {
					if st := sc.next(); st.http != nil {
						st.http(w)
					}
				})
				endpoint = rc.URL
			}
			dir := t.TempDir()
			writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 5)
			e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Protocol: tc.protocol, Endpoint: endpoint, Insecure: true,
				Follower: FollowerConfig{Poll: time.Hour, Linger: 2 * time.Second}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
			ts := make(timers)
			e.after = ts.after
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = e.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			for i, st := range tc.steps {
				next := receive(t, ts)
				assert.Equal(t, st.wait, next.d, "after step %d (%s) the exporter waits this long", i+1, st.name)
				assert.Equal(t, i+1, sc.requests(), "one request per step: none while it waited")
				if i == len(tc.steps)-1 {
					break
				}
				// Audit writes while the exporter backs off: none of them brings the next attempt
				// forward (a wake would have asked for the linger's timer, 2 s, before it).
				for range 5 {
					e.Notify()
				}
				next.c <- time.Now()
			}
			assert.Equal(t, uint64(5), e.Stats().Sent, "the lines went once the Collector took them")
			assert.NoError(t, e.Healthy())
			// Caught up: a write's Notify now starts the linger, then the exporter looks again.
			linger := receive(t, ts)
			assert.Equal(t, 2*time.Second, linger.d, "a write wakes a healthy exporter (the linger)")
			linger.c <- time.Now()
			assert.Equal(t, time.Hour, receive(t, ts).d)
			assert.Equal(t, len(tc.steps), sc.requests(), "nothing new to send, nothing sent")
		})
	}
}

// TestRetryAfterReadsEveryLine: seconds or an HTTP date, on any of the field's lines; the
// longest wait wins, a line that does not parse is ignored, a date past is no wait.
func TestRetryAfterReadsEveryLine(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		lines []string
		want  time.Duration
		ok    bool
	}{
		{nil, 0, false},
		{[]string{"soon"}, 0, false},
		{[]string{"-3"}, 0, false},
		{[]string{"30"}, 30 * time.Second, true},
		{[]string{" 30 "}, 30 * time.Second, true},
		{[]string{"30", "120"}, 2 * time.Minute, true},
		{[]string{"nonsense", "4"}, 4 * time.Second, true},
		{[]string{"99999999999999999999"}, MaxThrottle, true},
		{[]string{"Sun, 06 Dec 2026 12:01:00 GMT"}, time.Minute, true},
		{[]string{"Wed, 21 Oct 2126 07:28:00 GMT"}, MaxThrottle, true},
		{[]string{"Sun, 06 Dec 2026 11:00:00 GMT"}, 0, true},
		{[]string{"Sun, 06 Dec 2026 12:00:10 GMT", "5"}, 10 * time.Second, true},
	} {
		got, ok := retryAfter(tc.lines, now)
		assert.Equal(t, tc.ok, ok, "%q", tc.lines)
		assert.Equal(t, tc.want, got, "%q", tc.lines)
	}
}

// FuzzRetryAfter: whatever a Collector puts in Retry-After, the wait is never negative nor
// longer than MaxThrottle, and a field that gives none is no throttle.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"7", "0", "Wed, 21 Oct 2126 07:28:00 GMT", "soon", "-1", "99999999999999999999", " 3 ", ""} {
		f.Add(s, "5")
	}
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, a, b string) {
		d, ok := retryAfter([]string{a, b}, now)
		if d < 0 || d > MaxThrottle {
			t.Fatalf("retryAfter(%q, %q) = %s", a, b, d)
		}
		if !ok && d != 0 {
			t.Fatalf("no throttle, but a wait of %s", d)
		}
	})
}
