package policy_test

import (
	"net/netip"
	"testing"
)

func netipAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	return netip.MustParseAddr(s)
}
