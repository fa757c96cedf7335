package audit

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// A Collector that is overloaded says when to come back: OTLP/HTTP with a 429 or 503 and a
// Retry-After, OTLP/gRPC with a RetryInfo detail in its status (the OTLP specification,
// "Throttling"). The sender reports it as a *ThrottledError, and the Follower waits that long
// (bounded by MaxThrottle) before its next attempt.

// retryAfter reads an OTLP/HTTP Retry-After (RFC 9110, 10.2.3: seconds, or an HTTP date) from
// every line of the field: the longest wait any of them asks for, at most MaxThrottle; none
// when none parses.
func retryAfter(lines []string, now time.Time) (time.Duration, bool) {
	var after time.Duration
	found := false
	for _, v := range lines {
		v = strings.TrimSpace(v)
		var d time.Duration
		if secs, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
			d = MaxThrottle // beyond it, or beyond any number
			if err == nil && secs < uint64(MaxThrottle/time.Second) {
				d = time.Duration(secs) * time.Second
			}
		} else if t, err := http.ParseTime(v); err == nil {
			d = min(max(t.Sub(now), 0), MaxThrottle)
		} else {
			continue
		}
		after, found = max(after, d), true
	}
	return after, found
}

// retryInfo reads the RetryInfo detail of an OTLP/gRPC error status (the gRPC form of
// throttling), if it has one.
func retryInfo(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
