// Package otelcoltest runs a real OpenTelemetry Collector for tests: the OTLP receiver (gRPC and
// HTTP) on free loopback ports and the file exporter writing what it received to a file in the
// test's temporary folder, killed when the test ends. Stop and Restart play a Collector that goes
// away (a rollout, a crash) and comes back on the same ports.
//
// The Collector is built from test/otelcol by test/setup.sh into .tools/bin/otelcol (or named by
// $SANDGATE_OTELCOL). When it is missing the test is skipped, unless $SANDGATE_REQUIRE_TOOLS is
// set (CI), where it fails.
package otelcoltest

import (
	"bufio"
	"context"
	"encoding/json"
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
)

// startTimeout bounds how long a start may take to accept OTLP. Generous: test machines are
// often heavily loaded.
const startTimeout = 60 * time.Second

// Collector is one otelcol process owned by a test.
type Collector struct {
	// GRPC and HTTP are the receiver's "127.0.0.1:PORT" addresses, the same across Restart.
	GRPC, HTTP string
	// Out is the file exporter's output: one JSON object (an OTLP ExportLogsServiceRequest in
	// OTLP/JSON) a line, appended to across restarts.
	Out string

	t     testing.TB
	bin   string
	token string
	dir   string
	conf  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Option configures Start.
type Option func(*options)

type options struct{ token string }

// WithBearerToken makes the receiver refuse exports without "Authorization: Bearer token" (the
// bearertokenauth extension).
func WithBearerToken(token string) Option { return func(o *options) { o.token = token } }

// Start runs the Collector and waits until it accepts OTLP over HTTP.
func Start(t testing.TB, opts ...Option) *Collector {
	t.Helper()
	bin := binary(t)
	var o options
	for _, f := range opts {
		f(&o)
	}
	dir := t.TempDir()
	c := &Collector{token: o.token, t: t, bin: bin, dir: dir, GRPC: freeAddr(t), HTTP: freeAddr(t), Out: filepath.Join(dir, "logs.jsonl")}
	c.conf = filepath.Join(dir, "otelcol.yaml")
	// No batch processor: the receiver answers an export once the file exporter has taken it.
	// With rotation set, the file exporter writes each export straight to the file (no buffer,
	// appending to it across restarts), so an acknowledged record is in Out even after Kill.
	// The Collector's own metrics are off (no listener of its own on a fixed port).
	auth, ext := "", ""
	if o.token != "" {
		auth = ", auth: {authenticator: bearertokenauth}"
		ext = fmt.Sprintf("extensions:\n  bearertokenauth: {token: %q}\n", o.token)
	}
	conf := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: %q%s}
      http: {endpoint: %q%s}
%sexporters:
  file: {path: %q, rotation: {max_megabytes: 1024}}
service:
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  extensions: [%s]
  pipelines:
    logs: {receivers: [otlp], exporters: [file]}
`, c.GRPC, auth, c.HTTP, auth, ext, c.Out, map[bool]string{true: "bearertokenauth"}[o.token != ""])
	if err := os.WriteFile(c.conf, []byte(conf), 0o600); err != nil {
		t.Fatalf("otelcoltest: %v", err)
	}
	t.Cleanup(c.kill)
	if err := c.start(); err != nil {
		t.Fatalf("otelcoltest: %v", err)
	}
	return c
}

// HTTPEndpoint is the receiver's OTLP/HTTP URL.
func (c *Collector) HTTPEndpoint() string { return "http://" + c.HTTP }

// GRPCEndpoint is the receiver's OTLP/gRPC URL.
func (c *Collector) GRPCEndpoint() string { return "http://" + c.GRPC }

// Stop ends the Collector gracefully (SIGTERM: what it acknowledged is flushed to Out) and waits
// for it; exports are refused until Restart.
func (c *Collector) Stop() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(startTimeout):
		_ = c.cmd.Process.Kill()
		<-c.exited
		c.t.Errorf("otelcoltest: the Collector did not stop on SIGTERM within %s", startTimeout)
	}
	c.cmd = nil
}

// Kill ends the Collector with SIGKILL, as a crash or an OOM kill would, and waits for it;
// exports are refused until Restart.
func (c *Collector) Kill() { c.kill() }

// Restart starts the Collector again on the same ports after Stop or Kill.
func (c *Collector) Restart() {
	c.t.Helper()
	c.Stop()
	if err := c.start(); err != nil {
		c.t.Fatalf("otelcoltest: restart: %v", err)
	}
}

func (c *Collector) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	logFile, err := os.OpenFile(filepath.Join(c.dir, "otelcol.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(c.bin, "--config", c.conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c.cmd, c.exited = cmd, exited

	deadline := time.Now().Add(startTimeout)
	for {
		// An empty OTLP/HTTP export answers 200 once the pipeline runs (receivers start last).
		req, _ := http.NewRequest(http.MethodPost, c.HTTPEndpoint()+"/v1/logs", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			c.cmd = nil
			log, _ := os.ReadFile(filepath.Join(c.dir, "otelcol.log"))
			return fmt.Errorf("otelcol exited during start; log:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("otelcol did not accept OTLP on %s within %s", c.HTTP, startTimeout)
		}
	}
}

func (c *Collector) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
	c.cmd = nil
}

// Record is one log record as the file exporter wrote it, with its resource's attributes.
type Record struct {
	EventName      string
	Timestamp      time.Time
	SeverityNumber int
	SeverityText   string
	Body           string
	TraceID        string
	SpanID         string
	// Attributes hold strings, int64s (OTLP/JSON writes them as strings; they are parsed back),
	// bools and float64s.
	Attributes map[string]any
	Resource   map[string]any
	Scope      string
}

// Records reads every record in Out so far, in the order the Collector received them.
func (c *Collector) Records(t testing.TB) []Record {
	t.Helper()
	f, err := os.Open(c.Out)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("otelcoltest: %v", err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		var req exportRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			// The last line may be partly flushed while the Collector runs: read it next time.
			continue
		}
		for _, rl := range req.ResourceLogs {
			res := attrs(rl.Resource.Attributes)
			for _, sl := range rl.ScopeLogs {
				for _, lr := range sl.LogRecords {
					out = append(out, lr.record(res, sl.Scope.Name))
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("otelcoltest: read %s: %v", c.Out, err)
	}
	return out
}

// OTLP/JSON, as much of it as the tests read.
type exportRequest struct {
	ResourceLogs []struct {
		Resource struct {
			Attributes []keyValue `json:"attributes"`
		} `json:"resource"`
		ScopeLogs []struct {
			Scope struct {
				Name string `json:"name"`
			} `json:"scope"`
			LogRecords []logRecord `json:"logRecords"`
		} `json:"scopeLogs"`
	} `json:"resourceLogs"`
}

type logRecord struct {
	TimeUnixNano   string     `json:"timeUnixNano"`
	SeverityNumber int        `json:"severityNumber"`
	SeverityText   string     `json:"severityText"`
	Body           anyValue   `json:"body"`
	Attributes     []keyValue `json:"attributes"`
	TraceID        string     `json:"traceId"`
	SpanID         string     `json:"spanId"`
	EventName      string     `json:"eventName"`
}

type keyValue struct {
	Key   string   `json:"key"`
	Value anyValue `json:"value"`
}

type anyValue struct {
	StringValue *string  `json:"stringValue"`
	IntValue    *string  `json:"intValue"`
	BoolValue   *bool    `json:"boolValue"`
	DoubleValue *float64 `json:"doubleValue"`
}

func (v anyValue) value() any {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		n, _ := strconv.ParseInt(*v.IntValue, 10, 64)
		return n
	case v.BoolValue != nil:
		return *v.BoolValue
	case v.DoubleValue != nil:
		return *v.DoubleValue
	}
	return nil
}

func attrs(kvs []keyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.value()
	}
	return m
}

func (lr logRecord) record(res map[string]any, scope string) Record {
	r := Record{EventName: lr.EventName, SeverityNumber: lr.SeverityNumber, SeverityText: lr.SeverityText,
		TraceID: lr.TraceID, SpanID: lr.SpanID, Attributes: attrs(lr.Attributes), Resource: res, Scope: scope}
	if s, ok := lr.Body.value().(string); ok {
		r.Body = s
	}
	if ns, err := strconv.ParseInt(lr.TimeUnixNano, 10, 64); err == nil {
		r.Timestamp = time.Unix(0, ns).UTC()
	}
	return r
}

// WaitFor polls Records until done returns true for them or the deadline passes (then the test
// fails with msg).
func (c *Collector) WaitFor(t testing.TB, within time.Duration, msg string, done func([]Record) bool) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		recs := c.Records(t)
		if done(recs) {
			return recs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("otelcoltest: %s (after %s, %d records)", msg, within, len(recs))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otelcoltest: find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// binary finds the Collector, or skips the test (fails it under SANDGATE_REQUIRE_TOOLS).
func binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SANDGATE_OTELCOL")
	if bin == "" {
		bin = filepath.Join(repoRoot(), ".tools", "bin", "otelcol")
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("%s is missing: run test/setup.sh to build it from test/otelcol", bin)
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// repoRoot is the folder of the main module.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Validate has the Collector check a configuration file (`otelcol validate`), with env added to
// its environment; it returns the Collector's complaint when the file is not valid.
func Validate(t testing.TB, path string, env ...string) error {
	t.Helper()
	cmd := exec.Command(binary(t), "validate", "--config", path)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("otelcol validate %s: %w\n%s", path, err, out)
	}
	return nil
}
