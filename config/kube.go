package config

// Kubernetes configures the kube side. Its fields arrive with the issue that builds that side.
type Kubernetes struct{}

func (x *Kubernetes) applyDefaults(c *Config) {}

func (x *Kubernetes) validate(c *Config, errs *fieldErrors) {}
