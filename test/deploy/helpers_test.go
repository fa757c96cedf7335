package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/test/kubetest"
)

var repoRoot = kubetest.RepoRoot()

var chartDir = filepath.Join(repoRoot, "charts", "sandgate")

// chartCase is one set of values the chart is checked with: the defaults or a ci/ file.
type chartCase struct {
	name   string
	values string // path of a values file; "" for the defaults
}

// chartCases are the default values and every charts/sandgate/ci/*-values.yaml.
func chartCases(t *testing.T) []chartCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("want at least 3 values files under charts/sandgate/ci, found %d", len(files))
	}
	cases := []chartCase{{name: "default"}}
	for _, f := range files {
		cases = append(cases, chartCase{name: strings.TrimSuffix(filepath.Base(f), "-values.yaml"), values: f})
	}
	return cases
}

// helmBin finds the helm binary: $SANDGATE_HELM, else .tools/bin/helm. Without it the test is
// skipped, or fails under SANDGATE_REQUIRE_TOOLS.
func helmBin(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SANDGATE_HELM")
	if p == "" {
		p = filepath.Join(repoRoot, ".tools", "bin", "helm")
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", p)
		}
		t.Skipf("%s is missing: run test/setup.sh (set SANDGATE_REQUIRE_TOOLS=1 to fail instead)", p)
	}
	return p
}

// helm runs helm and returns stdout, stderr and the error.
func helm(t testing.TB, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(os.TempDir(), "sandgate-helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(os.TempDir(), "sandgate-helm-config"),
		"HELM_DATA_HOME="+filepath.Join(os.TempDir(), "sandgate-helm-data"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// valuesArgs are the helm flags of c's values (and extra --set flags).
func valuesArgs(c chartCase, set ...string) []string {
	var args []string
	if c.values != "" {
		args = append(args, "-f", c.values)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// render runs helm template for release in namespace ns and returns the objects.
func render(t testing.TB, c chartCase, release, ns string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", release, chartDir, "--namespace", ns}, valuesArgs(c)...)
	out, errOut, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return parseObjects(t, out)
}

func parseObjects(t testing.TB, manifests string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("parse rendered manifests: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the objects of kind, sorted by namespace/name.
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].GetNamespace()+"/"+out[i].GetName() < out[j].GetNamespace()+"/"+out[j].GetName()
	})
	return out
}

// one returns the only object of kind whose name ends in suffix.
func one(t testing.TB, objs []*unstructured.Unstructured, kind, suffix string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range find(objs, kind) {
		if strings.HasSuffix(o.GetName(), suffix) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s named *%s, found %d", kind, suffix, len(found))
	}
	return found[0]
}

// typed converts an unstructured object into out (a typed Kubernetes object).
func typed(t testing.TB, o *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("convert %s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

// configMapData returns a ConfigMap's data.
func configMapData(t testing.TB, o *unstructured.Unstructured) map[string]string {
	t.Helper()
	data, _, err := unstructured.NestedStringMap(o.Object, "data")
	if err != nil {
		t.Fatalf("ConfigMap %s data: %v", o.GetName(), err)
	}
	return data
}

// Absolute paths the chart mounts, rewritten under a temporary root to run the binary outside
// a pod.
var mountRoots = []string{"/etc/sandgate/", "/var/lib/sandgate/"}

// materialized is the chart's config and policies written out under a temporary root.
type materialized struct {
	root      string
	config    string // path of sandgate.yaml
	policyDir string
	cfg       *config.Config
}

// materialize writes the rendered config (mount paths moved under a temp root), the rendered
// policies (the repository's policies/ when the chart takes them from an existing ConfigMap), a
// fake file for each Secret-backed credential and, when the config names one, a CA made by
// `sandgate ca init`.
func materialize(t testing.TB, objs []*unstructured.Unstructured) materialized {
	t.Helper()
	root := t.TempDir()
	doc := configMapData(t, one(t, objs, "ConfigMap", "-config"))["sandgate.yaml"]
	if doc == "" {
		t.Fatal("the config ConfigMap has no sandgate.yaml")
	}
	for _, r := range mountRoots {
		doc = strings.ReplaceAll(doc, r, filepath.Join(root, r)+"/")
	}
	m := materialized{root: root, config: filepath.Join(root, "etc", "sandgate", "config", "sandgate.yaml")}
	mkdir(t, filepath.Dir(m.config))
	writeFile(t, m.config, doc)
	cfg, err := config.Parse([]byte(doc), filepath.Dir(m.config))
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, doc)
	}
	m.cfg = cfg
	m.policyDir = cfg.Policy.Dir
	mkdir(t, m.policyDir)
	var policies map[string]string
	for _, o := range find(objs, "ConfigMap") {
		if strings.HasSuffix(o.GetName(), "-policies") {
			policies = configMapData(t, o)
		}
	}
	if policies == nil { // policies.existingConfigMap: the user's ConfigMap; use the shipped ones
		policies = readDir(t, filepath.Join(repoRoot, "policies"))
	}
	for name, content := range policies {
		writeFile(t, filepath.Join(m.policyDir, name), content)
	}
	writeCredentials(t, objs, cfg)
	mkdir(t, cfg.Audit.File.Dir)
	if cfg.Proxy.CA.Cert != "" {
		run(t, sandgateBin(t), "ca", "init", "--dir", filepath.Dir(cfg.Proxy.CA.Cert))
	}
	return m
}

// writeCredentials writes each file-backed credential the config names: the audit keys from the
// chart's rendered Secret, a fresh EC key where the config reads a private key (the run tokens'
// signing key, a GitHub App's), a fake value for every other credential.
func writeCredentials(t testing.TB, objs []*unstructured.Unstructured, cfg *config.Config) {
	t.Helper()
	keys := auditKeys(t, objs)
	pemKeys := map[string]bool{}
	if cfg.RunTokens != nil {
		pemKeys[cfg.RunTokens.KeyCredential] = true
	}
	for _, c := range cfg.Credentials {
		if c.GitHubApp != nil {
			pemKeys[c.GitHubApp.PrivateKeyCredential] = true
		}
	}
	for _, c := range cfg.Credentials {
		if c.File != "" {
			mkdir(t, filepath.Dir(c.File))
			content, ok := keys[filepath.Base(c.File)]
			switch {
			case pemKeys[c.Name]:
				content = ecKeyPEM(t)
			case !ok || !strings.Contains(c.File, "/audit-keys/"):
				content = "fake-" + c.Name + "-value"
			}
			writeFile(t, c.File, content)
		}
	}
}

// ecKeyPEM is a new EC P-256 private key, PEM PKCS #8.
func ecKeyPEM(t testing.TB) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func readDir(t testing.TB, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = string(b)
		}
	}
	return out
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// run runs a command and returns its combined output, failing the test on a non-zero exit.
func run(t testing.TB, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The binary, built once per test run exactly as `make build` builds it.
var (
	buildOnce    sync.Once
	buildBin     string
	buildVersion string
	buildErr     error
	buildDir     string
)

// sandgateBin builds cmd/sandgate with the Makefile's environment and flags (`make -s
// print-build-flags`) into a temporary folder, once.
func sandgateBin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildBin, buildVersion, buildErr = build()
	})
	if buildErr != nil {
		t.Fatalf("build sandgate like `make build`: %v", buildErr)
	}
	return buildBin
}

func build() (bin, version string, err error) {
	// --no-print-directory: under `make test` this runs inside a recursive make, whose MAKEFLAGS
	// would otherwise add "Entering directory" lines around the output.
	out, err := exec.Command("make", "-s", "--no-print-directory", "-C", repoRoot, "print-build-flags").Output()
	if err != nil {
		return "", "", fmt.Errorf("make print-build-flags: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "CGO_ENABLED=") {
		return "", "", fmt.Errorf("make print-build-flags printed %q, want CGO_ENABLED=… and the flags", out)
	}
	env, flags := lines[0], lines[1]
	if _, v, ok := strings.Cut(flags, "-X main.version="); ok {
		version = strings.Fields(strings.Trim(v, `"' `))[0]
		version = strings.TrimRight(version, `"'`)
	}
	dir, err := os.MkdirTemp("", "sandgate-deploy-bin-")
	if err != nil {
		return "", "", err
	}
	buildDir = dir
	bin = filepath.Join(dir, "sandgate")
	// The same words as the Makefile's recipe, through a shell so that its quoting applies.
	cmd := exec.Command("bash", "-c", env+" go build "+flags+" -o "+bin+" ./cmd/sandgate")
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build %s: %w\n%s", flags, err, b)
	}
	return bin, version, nil
}

// staticELF reports why the file is not a statically linked executable, or nil.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("has a program interpreter (PT_INTERP): dynamically linked")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return err
	}
	if len(libs) > 0 {
		return fmt.Errorf("needs shared libraries (DT_NEEDED): %v", libs)
	}
	return nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
