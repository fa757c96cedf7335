package audit

import (
	"context"
	"strings"
)

// AuthHeader returns the header that authenticates an export and its value, read at each export
// so that a rotated credential is used from the next export on ("" for none).
type AuthHeader func() (name, value string)

// rpcAuth sends the auth header as metadata on every OTLP/gRPC call (OTLP/HTTP sets it on each
// request, see otlpSender.post).
type rpcAuth struct {
	auth     AuthHeader
	insecure bool
}

func (a rpcAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	name, value := a.auth()
	if name == "" {
		return nil, nil
	}
	return map[string]string{strings.ToLower(name): value}, nil
}

// RequireTransportSecurity is false only for an endpoint configured insecure, which the config
// allows with an auth header on loopback alone.
func (a rpcAuth) RequireTransportSecurity() bool { return !a.insecure }
