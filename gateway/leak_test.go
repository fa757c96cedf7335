package gateway

import (
	"os"
	"testing"

	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// sandboxReads holds every byte the gateway wrote to a sandbox in this package's tests (the
// harness's listener records each connection it accepts). TestMain fails the run when any of it
// betrays a credential value a harness gave the gateway (security invariant 1, over the whole
// suite), as the proxy's tests do.
var sandboxReads = respguardtest.NewReads()

func TestMain(m *testing.M) {
	if os.Getenv(leakyUpstreamEnv) != "" {
		serveLeakyStdio()
	}
	sandboxReads.Run(m)
}
