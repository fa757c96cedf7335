package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary play `sandbench -serve-upstreams DIR`.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "-serve-upstreams" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := ServeUpstreams(ctx, os.Args[2])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The stand-ins can run in a process of their own, so that their end of every connection does
// not count against the loadgen's open-file limit; the run still reads their counters.
func TestUpstreamsInOwnProcess(t *testing.T) {
	ctx := context.Background()
	up, err := startUpstreamsProcess(ctx, os.Args[0], t.TempDir())
	require.NoError(t, err)
	defer up.Stop()
	assert.NotEqual(t, os.Getpid(), up.proc.PID())

	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(up.CACertPEM()))
	before := up.ModelCounts()
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, up.TLSAddr)
		},
	}
	defer tr.CloseIdleConnections()
	for range 3 {
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + modelHost + "/v1/models")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	after := up.ModelCounts()
	assert.Equal(t, int64(1), after.Opened-before.Opened, "one kept-alive connection")
	assert.Equal(t, int64(1), after.Handshakes-before.Handshakes)
	assert.Equal(t, int64(1), after.Peak)

	up.Stop()
	select {
	case <-up.proc.done:
	default:
		t.Fatal("the stand-ins' process still runs after Stop")
	}
	assert.Zero(t, up.ModelCounts(), "no counters from a stopped process")
}
