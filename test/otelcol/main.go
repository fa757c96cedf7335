// Command otelcol is the OpenTelemetry Collector Sandgate's tests run: the OTLP receiver (gRPC
// and HTTP) and the contrib file exporter, so a test can send audit events through a real
// Collector and read what it received from a file; and the components of docs/audit.md's
// fan-out example (the batch processor, the OTLP/HTTP exporter, bearer-token auth), so the docs
// test can have this Collector validate it. test/setup.sh builds it into the tools
// cache; every collector module stays on one release line (v0.161.0 / v1.67.0), the newest on
// which the file exporter builds here.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/bearertokenauthextension"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func factories() (otelcol.Factories, error) {
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	var err error
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return f, err
	}
	if f.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](bearertokenauthextension.NewFactory()); err != nil {
		return f, err
	}
	f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory(), otlphttpexporter.NewFactory())
	return f, err
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "Sandgate's test Collector", Version: "v0.161.0"},
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
				DefaultScheme:     "env",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
