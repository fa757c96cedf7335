package faults

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// TestSIGTERMUnderLoadIsARollout: SIGTERM while two sandboxes keep calling (route and MCP) and
// four calls of a tool run longer than the drain. /readyz answers 503 shutting_down first, while
// new connections are still served for shutdown.delay; then the listeners drain for
// shutdown.drain, the long calls are cut, each with its event (outcome error "shutdown"), and
// sandgate exits 0 within delay + drain + 1 s. Every answered call has its event. Before,
// /readyz never said 503 (the admin listener closed 4 ms after the signal), new connections
// were refused at once, and 4 of 11 cut calls had no event.
func TestSIGTERMUnderLoadIsARollout(t *testing.T) {
	// A delay long enough for the calls made in it on a loaded machine.
	const delay, drain = 8 * time.Second, 3 * time.Second
	up := startUpstream(t, "everything", time.Hour) // long-op runs until it is cancelled
	g := startGate(t, upstreamsConfig(up.URL)+routeConfig(t, modelStandIn(t))+
		fmt.Sprintf("shutdown: {delay: %s, drain: %s}\n", delay, drain))

	const long = 4
	longDone := make(chan error, long)
	for i := range long {
		s := g.connect([]string{coder1, coder2}[i%2])
		go func() {
			_, _, err := s.call("long-op", nil)
			longDone <- err
		}()
	}
	for range long {
		select {
		case <-up.entered:
		case <-time.After(wait):
			t.Fatal("the long calls did not reach the upstream")
		}
	}
	l := &ledger{sent: map[string]bool{}}
	ug := &upGate{ch: make(chan struct{})}
	ug.up()
	stop := startLoad(t, g, l, ug)
	from := l.answered.Load()
	g.eventually("calls answered under load", func() bool { return l.answered.Load() >= from+50 })

	sent := time.Now()
	require.NoError(t, g.cmd.Process.Signal(sigterm))
	ug.down() // a loader that finds the listeners closed waits for the end of the test
	var body map[string]any
	g.eventually("/readyz says 503 shutting_down", func() bool {
		var code int
		code, body = g.readyz()
		return code == http.StatusServiceUnavailable
	})
	assert.Contains(t, fmt.Sprint(body["failing"]), "shutting_down")
	// New connections are served while /readyz says 503: a route call and a whole MCP session.
	fresh := &ledger{sent: map[string]bool{}}
	s, err := g.tryConnect(coder1)
	require.NoError(t, err, "a new MCP session during the delay (%s after SIGTERM)", time.Since(sent))
	ok, text, err := s.call("echo", map[string]any{"message": "during the delay"})
	require.NoError(t, err)
	assert.True(t, ok && text == "during the delay", text)
	require.NoError(t, routeCall(context.Background(), sourceClient(coder2), g, fresh, "during-the-delay"))
	require.True(t, fresh.sent["during-the-delay"], "the route call during the delay is answered")
	require.Less(t, time.Since(sent), delay, "these calls were made within the delay (a machine too slow proves nothing)")
	code, _ := g.readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code, "still 503")

	select {
	case <-g.exited:
	case <-time.After(delay + drain + wait):
		t.Fatal("sandgate did not exit")
	}
	took := time.Since(sent)
	stop()
	for range long {
		assert.Error(t, <-longDone, "a call longer than the drain is cut")
	}
	t.Logf("SIGTERM: exit %d after %s (delay %s + drain %s); %d calls answered under load", g.exitCode, took.Round(time.Millisecond), delay, drain, l.answered.Load())
	assert.Equal(t, 0, g.exitCode)
	assert.Less(t, took, delay+drain+time.Second, "exit within delay + drain + 1 s")

	res, err := audit.Query(context.Background(), g.auditDir, audit.Filter{Limit: -1})
	require.NoError(t, err)
	events := map[string]int{}
	var cut int
	for _, ev := range res.Events {
		if k := eventKey(ev); k != "" {
			events[k]++
		}
		if ev.Kind == audit.KindToolsCall && ev.Target.Tool == "long-op" {
			assert.Equal(t, "shutdown", ev.Outcome.Error, "%+v", ev.Outcome)
			cut++
		}
	}
	assert.Equal(t, long, cut, "each call longer than the drain has its event")
	for _, led := range []*ledger{l, fresh} {
		for k, answered := range led.sent {
			if answered {
				assert.Equal(t, 1, events[k], "answered call %s has one event", k)
			}
		}
	}
	assert.Equal(t, 1, events[argsKey("during the delay")])
	report, err := audit.Verify(g.auditDir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
}
