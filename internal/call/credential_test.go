package call_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// The one credential step: only the configured credential is injected, a policy naming another
// is refused as a policy matter, a configured credential without a value is refused rather
// than sent without it, and the event names the credential but never holds its value.
func TestTakeCredential(t *testing.T) {
	store := credential.FromValues(map[string]string{"anthropic": "sk-ant-value"})
	cases := []struct {
		name, configured, chosen, want, code string
		status                               int
	}{
		{name: "none configured, none chosen"},
		{name: "configured, policy silent", configured: "anthropic", want: "sk-ant-value"},
		{name: "configured and chosen", configured: "anthropic", chosen: "anthropic", want: "sk-ant-value"},
		{name: "chosen, none configured", chosen: "anthropic", code: call.CodeCredentialNotConfigured, status: 403},
		{name: "chosen another", configured: "anthropic", chosen: "openai", code: call.CodeCredentialNotConfigured, status: 403},
		{name: "configured, no value", configured: "github", code: call.CodeCredentialUnavailable, status: 502},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kept := &keptEvents{}
			core, err := call.New(call.Options{Audit: kept, Credentials: store,
				Policy: fixedDecider{policy.Decision{Allow: true, Revision: "r1", Credential: tc.chosen}}})
			require.NoError(t, err)
			id := identity.Identity{Known: true}
			_, g, rf := runCall(context.Background(), core, audit.KindHTTPRequest, id,
				call.Question{Input: &policy.Input{Kind: audit.KindHTTPRequest, Identity: id}, Credential: tc.configured}, nil)
			assert.Equal(t, tc.want, g.Credential)
			require.Len(t, kept.evs, 1)
			if tc.code == "" {
				require.Nil(t, rf)
			} else {
				require.NotNil(t, rf)
				assert.Equal(t, tc.code, rf.Code)
				assert.Equal(t, tc.status, kept.evs[0].Outcome.Status)
			}
			if tc.want != "" {
				assert.Equal(t, tc.configured, kept.evs[0].Credential)
			} else {
				assert.Empty(t, kept.evs[0].Credential)
			}
			assert.NotContains(t, kept.evs[0].Decision.Reason, "sk-ant-value")
		})
	}
}
