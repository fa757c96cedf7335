package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scrapeSeries is every sandgate_ series /metrics on admin exports, without its value.
func scrapeSeries(t *testing.T, admin string) []string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var series []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "sandgate_") {
			series = append(series, line[:strings.LastIndexByte(line, ' ')])
		}
	}
	slices.Sort(series)
	return series
}

// A sandbox cannot mint metric series: 10,000 requests through the real MCP listener, each
// answered with an error whose text the sandbox chose (the logging level it sent, quoted),
// leave the series /metrics exports as they were after the first; the texts are in the audit
// events' reasons, the label is the refusal's code.
func TestSandboxChosenErrorTextsMintNoSeries(t *testing.T) {
	cp := startCallPath(t)
	sid := cp.session(t, cpCoder)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(cpCoder)}, Timeout: 5 * time.Second}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1}, Timeout: 20 * time.Second}
	setLevel := func(i int) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+cp.mcp+"/mcp",
			strings.NewReader(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"logging/setLevel","params":{"level":"minted-%d"}}`, i, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Contains(t, string(body), fmt.Sprintf("minted-%d", i), "the answer quotes the sandbox's text")
	}
	setLevel(0)
	require.Eventually(t, func() bool { return len(cp.events(t)) > 0 }, 10*time.Second, 10*time.Millisecond)
	before := scrapeSeries(t, cp.admin)
	for i := 1; i < 10000; i++ {
		setLevel(i)
	}
	after := scrapeSeries(t, cp.admin)
	for _, s := range after {
		if !assert.NotContains(t, s, "minted-", "a sandbox's text is a label value") {
			break
		}
	}
	assert.Equal(t, len(before), len(after), "series added: %v", added(before, after))
	assert.Contains(t, strings.Join(after, "\n"), `code="bad_params",kind="mcp.logging_set_level"`)

	var last audit.Event
	require.Eventually(t, func() bool {
		evs := cp.events(t)
		last = evs[len(evs)-1]
		return strings.Contains(last.Decision.Reason, "minted-9999")
	}, 10*time.Second, 10*time.Millisecond, "the text stays in the event: %+v", last)
	assert.Equal(t, call.CodeBadParams, last.Outcome.Error)
}

func added(before, after []string) []string {
	var out []string
	for _, s := range after {
		if _, found := slices.BinarySearch(before, s); !found {
			out = append(out, s)
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("… %d more", len(out)-10))
	}
	return out
}
