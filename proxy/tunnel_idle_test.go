package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

const testIdle = 600 * time.Millisecond

// rawUpstream is a plain TCP server on loopback that runs serve on each connection; a tunnel
// harness built with tunnelTo dials it for every destination.
func rawUpstream(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return ln.Addr().String()
}

// tunnelHarness is the proxy harness with a short idle timeout whose dials all reach upstream.
func tunnelHarness(t *testing.T, upstream string) *harness {
	return newHarnessWith(t, func(o *Options) {
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("proxy dialed %q, not a loopback ip:port", addr)
				return nil, net.UnknownNetworkError("test: refused")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, upstream)
		}
	}, func(p *config.Proxy) { p.Limits.TunnelIdleTimeout = config.Duration(testIdle) })
}

// openTunnel opens a CONNECT tunnel from a sandbox address and checks it was established.
func openTunnel(t *testing.T, h *harness, from, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	resp, br, c := h.connect(t, from, target)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return c, br
}

func TestTunnelIdleTimeout(t *testing.T) {
	const alpha = "127.0.0.2"
	isTunnel := func(e audit.Event) bool { return e.Kind == audit.KindHTTPConnect && e.Target.Host == "tunnel.test" }

	t.Run("traffic one way keeps the tunnel open past the idle timeout", func(t *testing.T) {
		// The client sends one byte, then only reads while the upstream streams for three
		// idle periods: the client's direction is silent all along, the tunnel is not idle.
		const ticks = 12
		up := rawUpstream(t, func(c net.Conn) {
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return
			}
			for range ticks {
				time.Sleep(testIdle / 4)
				if _, err := c.Write([]byte{'x'}); err != nil {
					return
				}
			}
		})
		h := tunnelHarness(t, up)
		c, br := openTunnel(t, h, alpha, "tunnel.test:443")
		_, err := c.Write([]byte{'?'})
		require.NoError(t, err)
		got, err := io.ReadAll(br)
		require.NoError(t, err, "the upstream's close ends the tunnel")
		assert.Equal(t, strings.Repeat("x", ticks), string(got))
		ev := h.rec.waitFor(t, isTunnel)
		assert.Empty(t, ev.Outcome.Error)
		assert.Greater(t, ev.Outcome.DurationMS, float64(2*testIdle/time.Millisecond))
	})

	t.Run("traffic the other way keeps it open too", func(t *testing.T) {
		// The upstream only reads: the client's bytes are the tunnel's only traffic.
		received := make(chan int, 1)
		up := rawUpstream(t, func(c net.Conn) {
			n, _ := io.Copy(io.Discard, c)
			received <- int(n)
		})
		h := tunnelHarness(t, up)
		c, _ := openTunnel(t, h, alpha, "tunnel.test:443")
		const ticks = 12
		for range ticks {
			_, err := c.Write([]byte{'y'})
			require.NoError(t, err, "the tunnel stays open while the client sends")
			time.Sleep(testIdle / 4)
		}
		require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite())
		assert.Equal(t, ticks, <-received)
		ev := h.rec.waitFor(t, isTunnel)
		assert.Empty(t, ev.Outcome.Error)
	})

	t.Run("a tunnel with no traffic either way is closed after the idle timeout", func(t *testing.T) {
		up := rawUpstream(t, func(c net.Conn) {
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return
			}
			_, _ = c.Write(b[:])
			_, _ = io.Copy(io.Discard, c) // then silence, until the proxy closes
		})
		h := tunnelHarness(t, up)
		c, br := openTunnel(t, h, alpha, "tunnel.test:443")
		_, err := c.Write([]byte{'!'})
		require.NoError(t, err)
		b, err := br.ReadByte()
		require.NoError(t, err)
		assert.Equal(t, byte('!'), b)
		start := time.Now()
		_, err = br.ReadByte()
		assert.ErrorIs(t, err, io.EOF, "the proxy closes the idle tunnel")
		waited := time.Since(start)
		assert.GreaterOrEqual(t, waited, testIdle-50*time.Millisecond)
		assert.Less(t, waited, 3*testIdle)
		ev := h.rec.waitFor(t, isTunnel)
		assert.Equal(t, "idle_timeout", ev.Outcome.Error)
	})
}
