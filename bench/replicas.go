package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The replicas cells: the route workload against three Sandgate replicas sharing state through
// Redis (one node, or a 3-primary Cluster), the bench client choosing a replica per request in
// turn (round-robin, as a Service would spread connections), against one replica keeping its
// state in memory (the floor). Reported: CPU per request of the Sandgate processes and of Redis,
// and Redis commands and scripts per request (INFO commandstats, delta over the window / requests).

// ReplicaCell is one row of the replicas table.
type ReplicaCell struct {
	Name        string  // memory-1, redis-3, cluster-3
	Requests    int64   // completed in the window
	Errors      int64   // failed in the window
	RPS         float64 // completed per second
	SandgateUS  float64 // Sandgate CPU µs per request, all replicas together
	RedisUS     float64 // redis-server CPU µs per request, all nodes together
	Commands    float64 // Redis commands run per request, those inside scripts included (INFO commandstats)
	Scripts     float64 // of which script calls (EVAL, EVALSHA, FCALL) per request
	Concurrency int
}

// RunReplicas measures the replicas cells with o's binaries, sandboxes, concurrency (its first
// value) and closed-loop window, and returns them in order memory-1, redis-3, cluster-3.
func RunReplicas(ctx context.Context, o Options) ([]ReplicaCell, error) {
	dir, err := os.MkdirTemp("", "sandbench-replicas-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	up, err := StartUpstreams(ctx, filepath.Join(dir, "upstreams"))
	if err != nil {
		return nil, err
	}
	defer up.Stop()
	conc := 32
	if len(o.Concurrency) > 0 {
		conc = o.Concurrency[0]
	}
	sandboxes := min(o.Sandboxes, 200)
	var cells []ReplicaCell
	for _, c := range []struct {
		name     string
		replicas int
		nodes    int // 0: memory, 1: one redis, 3: a cluster
	}{{"memory-1", 1, 0}, {"redis-3", 3, 1}, {"cluster-3", 3, 3}} {
		cell, err := runReplicaCell(ctx, o, up, filepath.Join(dir, c.name), c.name, c.replicas, c.nodes, sandboxes, conc)
		if err != nil {
			return cells, fmt.Errorf("replicas cell %s: %w", c.name, err)
		}
		if o.Progress != nil {
			o.Progress(fmt.Sprintf("replicas %s: %.0f req/s, sandgate %.1f µs/req, redis %.1f µs/req, %.2f redis commands/req (%.2f scripts), %d errors",
				cell.Name, cell.RPS, cell.SandgateUS, cell.RedisUS, cell.Commands, cell.Scripts, cell.Errors))
		}
		cells = append(cells, cell)
	}
	return cells, nil
}

func runReplicaCell(ctx context.Context, o Options, up *Upstreams, dir, name string, replicas, nodes, sandboxes, conc int) (ReplicaCell, error) {
	cell := ReplicaCell{Name: name, Concurrency: conc}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cell, err
	}
	redisNodes, redisYAML, err := startRedis(ctx, dir, nodes)
	defer func() {
		for _, p := range redisNodes {
			p.proc.Stop(2 * time.Second)
		}
	}()
	if err != nil {
		return cell, err
	}
	routes, procs, err := startReplicaProcs(ctx, o, up, dir, name, replicas, redisYAML, sandboxes)
	defer func() {
		for _, p := range procs {
			p.Stop(10 * time.Second)
		}
	}()
	if err != nil {
		return cell, err
	}
	d := o.ClosedDuration
	if d <= 0 {
		d = 2 * time.Second
	}
	var done, failed atomic.Int64
	var measuring atomic.Bool
	loadCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range conc {
		c := replicaClients(routes, sandboxAddr(w%sandboxes))
		wg.Go(func() {
			defer func() {
				for _, x := range c {
					x.Close()
				}
			}()
			for seq := w; loadCtx.Err() == nil; seq += conc {
				err := c[seq%len(c)].Do(loadCtx, seq) // round-robin over the replicas
				if !measuring.Load() || loadCtx.Err() != nil {
					continue
				}
				if err != nil {
					failed.Add(1)
				} else {
					done.Add(1)
				}
			}
		})
	}
	sleepCtx(ctx, o.Warmup)
	sgBefore, rdBefore := replicasCPU(procs), replicasCPU(redisProcs(redisNodes))
	callsBefore, scriptsBefore := commandCalls(ctx, redisNodes)
	measuring.Store(true)
	start := time.Now()
	sleepCtx(ctx, d)
	measuring.Store(false)
	elapsed := time.Since(start)
	sgAfter, rdAfter := replicasCPU(procs), replicasCPU(redisProcs(redisNodes))
	callsAfter, scriptsAfter := commandCalls(ctx, redisNodes)
	n := done.Load()
	stop()
	wg.Wait()
	cell.Requests, cell.Errors = n, failed.Load()
	if n == 0 {
		return cell, fmt.Errorf("no request completed (%d failed)", cell.Errors)
	}
	cell.RPS = float64(n) / elapsed.Seconds()
	cell.SandgateUS = us(sgAfter-sgBefore) / float64(n)
	cell.RedisUS = us(rdAfter-rdBefore) / float64(n)
	// The first sample's INFO on each node is not the requests'.
	extra := int64(len(redisNodes))
	cell.Commands = float64(max(0, callsAfter-callsBefore-extra)) / float64(n)
	cell.Scripts = float64(scriptsAfter-scriptsBefore) / float64(n)
	return cell, nil
}

// startReplicaProcs starts `sandgate serve` replicas with the bench config plus redisYAML (none:
// memory state) and returns their route URLs and processes (those started, also on error).
func startReplicaProcs(ctx context.Context, o Options, up *Upstreams, dir, name string, replicas int, redisYAML string, sandboxes int) ([]string, []*process, error) {
	var routes []string
	var procs []*process
	for i := range replicas {
		rdir := filepath.Join(dir, fmt.Sprintf("sandgate-%d", i))
		if err := os.MkdirAll(rdir, 0o700); err != nil {
			return routes, procs, err
		}
		cfg, _, prx, admin, err := sandgateFiles(rdir, o.PolicyDir, up, sandboxes, variant{})
		if err != nil {
			return routes, procs, err
		}
		if redisYAML != "" {
			if err := appendFile(cfg, "redis: "+redisYAML+"\n"); err != nil {
				return routes, procs, err
			}
		}
		p, err := startProcess(fmt.Sprintf("%s-sandgate-%d", name, i), rdir,
			[]string{"SSL_CERT_FILE=" + up.CAPath, "SANDGATE_REPLICA=" + fmt.Sprint(i)}, o.SandgateBin, "serve", "--config", cfg)
		if err != nil {
			return routes, procs, err
		}
		procs = append(procs, p)
		if err := p.waitHTTP(ctx, "http://"+admin+"/readyz", 60*time.Second); err != nil {
			return routes, procs, err
		}
		routes = append(routes, "http://"+prx+"/routes/anthropic/v1/messages")
	}
	return routes, procs, nil
}

// replicaClients are one sandbox's clients of the route on each replica (its own source address).
func replicaClients(routes []string, src interface{ String() string }) []*httpClient {
	var out []*httpClient
	for _, u := range routes {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src.String())}, Timeout: 5 * time.Second}
		tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}
		out = append(out, &httpClient{hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}, tr: tr, url: u, model: true})
	}
	return out
}

func replicasCPU(procs []*process) time.Duration {
	var total time.Duration
	for _, p := range procs {
		if d, err := p.meter.CPU(); err == nil {
			total += d
		}
	}
	return total
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// redisNode is one redis-server of a cell.
type redisNode struct {
	proc *process
	addr string
}

func redisProcs(nodes []redisNode) []*process {
	var out []*process
	for _, n := range nodes {
		out = append(out, n.proc)
	}
	return out
}

// startRedis starts n redis-servers on loopback (none for 0; a Cluster for 3) and returns the
// config's redis section for them.
func startRedis(ctx context.Context, dir string, n int) ([]redisNode, string, error) {
	var nodes []redisNode
	for i := range n {
		port, err := freePort()
		if err != nil {
			return nodes, "", err
		}
		ndir := filepath.Join(dir, fmt.Sprintf("redis-%d", i))
		if err := os.MkdirAll(ndir, 0o700); err != nil {
			return nodes, "", err
		}
		args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--dir", ndir}
		if n > 1 {
			args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(ndir, "nodes.conf"))
		}
		p, err := startProcess(fmt.Sprintf("redis-%d-%d", n, i), ndir, nil, "redis-server", args...)
		if err != nil {
			return nodes, "", err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		nodes = append(nodes, redisNode{proc: p, addr: addr})
		if err := p.waitTCP(ctx, addr, 20*time.Second); err != nil {
			return nodes, "", err
		}
	}
	var addrs []string
	for _, nd := range nodes {
		addrs = append(addrs, nd.addr)
	}
	switch {
	case n == 0:
		return nil, "", nil
	case n == 1:
		return nodes, fmt.Sprintf("{addr: %q}", addrs[0]), nil
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nodes, "", fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, nd := range nodes {
		for !strings.Contains(redisInfo(ctx, nd.addr, "CLUSTER INFO"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				return nodes, "", fmt.Errorf("cluster node %s not ok", nd.addr)
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
	}
	return nodes, fmt.Sprintf("{cluster: {addrs: [%s]}}", strings.Join(addrs, ", ")), nil
}

// commandCalls sums, over the nodes, the calls of every command in INFO commandstats (commands
// run inside scripts included: Redis counts those too, in total_commands_processed as well) and
// of the script commands (EVAL, EVALSHA and their _RO forms, FCALL). A client's round trips are
// the commands it sent: commands run minus those run inside scripts, which Redis does not count
// apart, so the report shows both figures.
func commandCalls(ctx context.Context, nodes []redisNode) (run, scripts int64) {
	for _, nd := range nodes {
		sc := bufio.NewScanner(strings.NewReader(redisInfo(ctx, nd.addr, "INFO commandstats")))
		for sc.Scan() {
			name, rest, ok := strings.Cut(sc.Text(), ":calls=")
			if !ok {
				continue
			}
			num, _, _ := strings.Cut(rest, ",")
			v, _ := strconv.ParseInt(num, 10, 64)
			run += v
			switch strings.TrimPrefix(name, "cmdstat_") {
			case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
				scripts += v
			}
		}
	}
	return run, scripts
}

// redisInfo runs one redis-cli command against addr and returns its output ("" on error).
func redisInfo(ctx context.Context, addr, command string) string {
	host, port, _ := net.SplitHostPort(addr)
	args := append([]string{"-h", host, "-p", port}, strings.Fields(command)...)
	out, err := exec.CommandContext(ctx, "redis-cli", args...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// ReplicasMarkdown renders the replicas cells as a table for the report.
func ReplicasMarkdown(cells []ReplicaCell) string {
	var b strings.Builder
	b.WriteString("## Replicas: 3 Sandgate replicas on shared Redis vs 1 replica with memory state (route, closed loop)\n\n")
	b.WriteString("| cell | clients | req/s | errors | Sandgate CPU µs/req (all replicas) | Redis CPU µs/req | Redis commands run/req (inside scripts included) | of which scripts/req |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range cells {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %d | %.1f | %.1f | %.2f | %.2f |\n", c.Name, c.Concurrency, c.RPS, c.Errors, c.SandgateUS, c.RedisUS, c.Commands, c.Scripts)
	}
	b.WriteString("\nINFO commandstats deltas over the window, divided by the requests completed in it. Redis counts the commands a script runs as well as the script, so round trips per request lie between scripts/req and commands/req.\n")
	return b.String()
}
