// Package bench measures Sandgate as a separate process under the load of many simulated
// sandboxes, against peers measured in the same run: direct to the upstream (no proxy), a bare
// Go CONNECT relay (bench/cmd/relay), Squid, tinyproxy and Smokescreen.
//
// Every sandbox is its own loopback source address (127.10.x.y), so identity, policy and audit
// run as in production. Cells (workload × target) are run interleaved, several repetitions,
// and medians are reported. Two load shapes: a fixed offered rate (open loop, latency measured
// from the scheduled send time, so a slow proxy cannot hide its queueing) and closed-loop
// saturation with a fixed number of concurrent clients. Proxy CPU, RSS and open files come
// from /proc/PID of the proxy process; upstream connections and TLS handshakes are counted by
// the stand-in upstreams. Only loopback addresses are ever dialed.
//
// `make bench` runs it (bench/cmd/sandbench); results land in bench/results/.
package bench
