package kubetest

import (
	"os"
	"path/filepath"
)

// Release is a release of the upstream Agent Sandbox whose CRDs and controller test/setup.sh
// installs: the CRDs under .tools/<dir>/crds, the controller as .tools/bin/<controller>. Tests
// of what identity rests on run against each (Releases), since every fact Sandgate reads is one
// a release's controller writes.
type Release struct {
	// Version is the release's module version, as test/setup.sh pins it.
	Version string
	dir     string   // under .tools: crds/ and the stamp
	bin     string   // under .tools/bin
	flags   []string // controller flags of this release beyond those every release takes
}

var releases = []Release{
	// v0.5.6 serves v1alpha1 through a conversion webhook; without it (kubetest installs the
	// CRDs with conversion None) the webhook must be off.
	{Version: "v0.5.6", dir: "agent-sandbox", bin: "agent-sandbox-controller", flags: []string{"--enable-webhook=false"}},
	// v1.0.1 (GA) serves v1beta1 only and has no webhook flag.
	{Version: "v1.0.1", dir: "agent-sandbox-v1.0.1", bin: "agent-sandbox-controller-v1.0.1"},
}

// Releases are the supported Agent Sandbox releases, oldest first.
func Releases() []Release { return append([]Release(nil), releases...) }

// DefaultRelease is the release Start installs: the oldest supported one.
func DefaultRelease() Release { return releases[0] }

// String is the version, for subtest names.
func (r Release) String() string { return r.Version }

// CRDDir is the folder of the release's CRDs test/setup.sh copied from the pinned module:
// .tools/<dir>/crds, or $SANDGATE_AGENT_SANDBOX_CRDS for the default release.
func (r Release) CRDDir() string {
	if d := os.Getenv("SANDGATE_AGENT_SANDBOX_CRDS"); d != "" && r.Version == DefaultRelease().Version {
		return d
	}
	return filepath.Join(RepoRoot(), ".tools", r.dir, "crds")
}

// Controller is the path of the release's controller binary: .tools/bin/<bin>, or
// $SANDGATE_AGENT_SANDBOX_CONTROLLER for the default release.
func (r Release) Controller() string {
	if p := os.Getenv("SANDGATE_AGENT_SANDBOX_CONTROLLER"); p != "" && r.Version == DefaultRelease().Version {
		return p
	}
	return filepath.Join(RepoRoot(), ".tools", "bin", r.bin)
}
