// Package kubetest runs a real etcd and kube-apiserver for tests, on free loopback ports under
// t.TempDir(), with RBAC enforced and the upstream Agent Sandbox CRDs installed; StartController
// adds the upstream Agent Sandbox controller.
//
// The kube-apiserver binary is built from test/kube-apiserver by test/setup.sh into
// .tools/bin/kube-apiserver (or named by $SANDGATE_KUBE_APISERVER); etcd comes from Debian's
// etcd-server package (or $SANDGATE_ETCD). The Agent Sandbox CRDs are those of a pinned release
// (Releases: v0.5.6 by default, v1.0.1 with StartRelease), copied by test/setup.sh under .tools,
// and its controller is built to .tools/bin. When something is missing the test is skipped,
// unless $SANDGATE_REQUIRE_KUBE is set (CI), where it fails.
//
// There is no kubelet and no controller-manager: pods stay Pending, tests set status.podIPs
// through the status subresource (SetPodIPs), and nothing garbage-collects owned objects.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// Tokens of the users the apiserver knows.
const (
	// AdminToken authenticates "admin" in group system:masters (every permission).
	AdminToken = "sandgate-test-admin-token"
	// SandgateToken authenticates "sandgate", which has no permission until a test binds
	// RBAC rules to it.
	SandgateToken = "sandgate-test-sandgate-token"
	// SandgateUser is the user name of SandgateToken, the subject to bind roles to.
	SandgateUser = "sandgate"
	// ControllerToken authenticates ControllerUser in group system:masters: the Agent Sandbox
	// controller runs as it, and tests write what only the controller may write (past the
	// chart's identity admission policy) as it.
	ControllerToken = "sandgate-test-controller-token"
	// ControllerUser is the user name of the upstream controller's ServiceAccount
	// (agent-sandbox-system/agent-sandbox-controller, as its release manifests install it).
	ControllerUser = "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"
	// TenantToken authenticates TenantUser, a tenant of a sandbox namespace: no permission
	// until a test binds rules to it (BindRules, TenantRules).
	TenantToken = "sandgate-test-tenant-token"
	// TenantUser is the user name of TenantToken.
	TenantUser = "tenant"
)

// Cluster is a running etcd + kube-apiserver.
type Cluster struct {
	// Admin is a client config authenticated as a cluster administrator.
	Admin *rest.Config
	// Sandgate is a client config authenticated as SandgateUser (no permissions by default).
	Sandgate *rest.Config
	// Controller is a client config authenticated as ControllerUser (every permission).
	Controller *rest.Config
	// Tenant is a client config authenticated as TenantUser (no permissions by default).
	Tenant *rest.Config
	// Dir holds the data, keys, certificates and logs.
	Dir string
	// Release is the Agent Sandbox release whose CRDs are installed and whose controller
	// StartController runs.
	Release Release
}

// Start runs etcd and kube-apiserver, waits until the apiserver is ready and the CRDs of the
// default Agent Sandbox release are served, and stops both when the test ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartRelease(t, DefaultRelease())
}

// StartRelease is Start with the CRDs of release r (and its controller for StartController).
func StartRelease(t testing.TB, r Release) *Cluster {
	t.Helper()
	apiserver := binary(t)
	crdFiles(t, r) // skip before starting anything when the CRDs are missing
	etcdBin := os.Getenv("SANDGATE_ETCD")
	if etcdBin == "" {
		etcdBin = "etcd"
	}
	if _, err := exec.LookPath(etcdBin); err != nil {
		missing(t, "etcd not found (%v): run test/setup.sh (it installs Debian's etcd-server)", err)
	}
	dir := t.TempDir()
	c := &Cluster{Dir: dir, Release: r}

	etcdURL := startEtcd(t, etcdBin, dir)
	port := freePort(t)
	startAPIServer(t, apiserver, dir, etcdURL, port)

	host := "https://127.0.0.1:" + strconv.Itoa(port)
	c.Admin = c.config(host, AdminToken)
	c.Sandgate = c.config(host, SandgateToken)
	c.Controller = c.config(host, ControllerToken)
	c.Tenant = c.config(host, TenantToken)
	crds := crdFiles(t, r)
	waitReady(t, c.Admin, filepath.Join(dir, "kube-apiserver.log"))
	installCRDs(t, c.Admin, crds)
	return c
}

// Clients returns typed and dynamic clients for cfg.
func Clients(t testing.TB, cfg *rest.Config) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kubetest: client: %v", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kubetest: dynamic client: %v", err)
	}
	return cs, dyn
}

func (c *Cluster) config(host, token string) *rest.Config {
	ca, err := os.ReadFile(filepath.Join(c.Dir, "certs", "apiserver.crt"))
	tls := rest.TLSClientConfig{CAData: ca}
	if err != nil {
		tls = rest.TLSClientConfig{Insecure: true}
	}
	return &rest.Config{Host: host, BearerToken: token, TLSClientConfig: tls, QPS: 200, Burst: 400, Timeout: 30 * time.Second}
}

// binary finds the kube-apiserver, or skips (fails under SANDGATE_REQUIRE_KUBE).
func binary(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SANDGATE_KUBE_APISERVER")
	if p == "" {
		p = filepath.Join(RepoRoot(), ".tools", "bin", "kube-apiserver")
	}
	if _, err := os.Stat(p); err != nil {
		missing(t, "%s is missing: run test/setup.sh to build it from test/kube-apiserver", p)
	}
	return p
}

func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("SANDGATE_REQUIRE_KUBE") != "" {
		t.Fatalf("kubetest (SANDGATE_REQUIRE_KUBE is set): "+format, args...)
	}
	t.Skipf("kubetest: "+format+" (set SANDGATE_REQUIRE_KUBE=1 to fail instead of skip)", args...)
}

// RepoRoot is the folder of the main module.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func startEtcd(t testing.TB, bin, dir string) string {
	t.Helper()
	client, peer := freePort(t), freePort(t)
	clientURL := "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	start(t, "etcd", dir, bin,
		"--name=kubetest", "--data-dir="+etcdDataDir(t, dir),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--snapshot-count=100000", "--log-level=warn", "--logger=zap")
	return clientURL
}

// etcdDataDir is where a test's etcd keeps its data: in memory (/dev/shm) where the machine has
// it, else under dir. etcd syncs its log on every write, and a disk that stalls (CI saw a 7.3 s
// fdatasync on a busy machine) times out the apiserver's requests ("etcdserver: request timed
// out") however long the test waits; on tmpfs a sync costs nothing. The directory goes when the
// test ends, after etcd (cleanups run last-registered first, and etcd's stop is registered after).
func etcdDataDir(t testing.TB, dir string) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if shm, err := os.MkdirTemp("/dev/shm", "sandgate-kubetest-etcd-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(shm) })
			return shm
		}
	}
	return filepath.Join(dir, "etcd")
}

func startAPIServer(t testing.TB, bin, dir, etcdURL string, port int) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("kubetest: service account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("kubetest: service account key: %v", err)
	}
	write(t, filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	write(t, filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	write(t, filepath.Join(dir, "tokens.csv"), []byte(
		AdminToken+",admin,admin,system:masters\n"+
			SandgateToken+","+SandgateUser+","+SandgateUser+"\n"+
			ControllerToken+","+ControllerUser+","+ControllerUser+",system:masters\n"+
			TenantToken+","+TenantUser+","+TenantUser+"\n"))
	start(t, "kube-apiserver", dir, bin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port), "--cert-dir="+filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--v=0")
}

// start runs a process with its output appended to DIR/NAME.log and stops it (SIGTERM, then
// SIGKILL) when the test ends, or earlier through the returned function (idempotent); the
// log's tail is printed if the test failed.
func start(t testing.TB, name, dir, bin string, args ...string) (stop func()) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("kubetest: start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			logFile.Close()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("kubetest: last lines of %s:\n%s", logPath, tail(logPath, 30))
		}
	})
	return stop
}

func waitReady(t testing.TB, cfg *rest.Config, logPath string) {
	t.Helper()
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatalf("kubetest: transport: %v", err)
	}
	hc := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("kubetest: kube-apiserver not ready after 90s (last: %s)\n%s", last, tail(logPath, 40))
}

// CRDDir is the folder of the default release's CRDs (Release.CRDDir).
func CRDDir() string { return DefaultRelease().CRDDir() }

func crdFiles(t testing.TB, r Release) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.CRDDir(), "*.yaml"))
	if err != nil || len(files) == 0 {
		missing(t, "no Agent Sandbox %s CRDs under %s: run test/setup.sh (it copies them from the pinned release)", r.Version, r.CRDDir())
	}
	return files
}

// installCRDs creates the upstream CRDs as released, except spec.conversion: the release
// converts v1alpha1 through a webhook Service in agent-sandbox-system, which does not exist here
// (the controller runs with --enable-webhook=false and says its CRDs must then use strategy
// None; with Webhook the apiserver cannot even decode stored v1beta1 objects for its watch
// cache). Every test object is v1beta1, the storage version.
func installCRDs(t testing.TB, cfg *rest.Config, files []string) {
	t.Helper()
	_, dyn := Clients(t, cfg)
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var served []schema.GroupVersionResource
	for _, f := range files {
		obj := &unstructured.Unstructured{}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			t.Fatalf("kubetest: %s: %v", f, err)
		}
		if err := unstructured.SetNestedMap(obj.Object, map[string]any{"strategy": "None"}, "spec", "conversion"); err != nil {
			t.Fatalf("kubetest: %s: %v", f, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubetest: create CRD %s: %v", f, err)
		}
		group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "plural")
		versions, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
		for _, v := range versions {
			name, _, _ := unstructured.NestedString(v.(map[string]any), "name")
			if storage, _, _ := unstructured.NestedBool(v.(map[string]any), "storage"); !storage {
				continue
			}
			served = append(served, schema.GroupVersionResource{Group: group, Version: name, Resource: plural})
		}
	}
	// Served, and in discovery: a controller that starts before discovery lists a kind fails to
	// set up its controller for it and exits.
	cs, _ := Clients(t, cfg)
	for _, gvr := range served {
		for {
			_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			if err == nil {
				err = inDiscovery(cs, gvr)
			}
			if err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatalf("kubetest: %s not served: %v", gvr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func inDiscovery(cs kubernetes.Interface, gvr schema.GroupVersionResource) error {
	l, err := cs.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		return err
	}
	for _, r := range l.APIResources {
		if r.Name == gvr.Resource {
			return nil
		}
	}
	return fmt.Errorf("%s not in discovery yet", gvr)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("kubetest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteKubeconfig writes cfg as a kubeconfig file (for commands that take --kubeconfig) and
// returns its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("kubetest: write kubeconfig: %v", err)
	}
	return path
}
