// Command kube-apiserver is the upstream Kubernetes API server, built from the
// Go module proxy so Sandgate's tests run against a real apiserver without
// downloading release binaries. See test/kubetest for how tests start it.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
