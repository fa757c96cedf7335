// Package config is Sandgate's one configuration file: a YAML document decoded strictly into
// one typed struct and validated at load. Every error names the field (as a YAML path such as
// "upstreams[1].url") and says what is wrong, so an operator can fix the file without reading
// code. Credentials are referenced by name and read from files or environment variables: the
// config file never holds a secret value.
package config
