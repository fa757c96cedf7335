package call_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// mintedSource is a minted credential source for the unit test of the call step alone; the
// acceptance tests mint at real servers (cmd/sandgate/credentials_*_test.go).
type mintedSource struct {
	lease credential.Lease
	err   error
	runs  []credential.Run
}

func (m *mintedSource) Get(string) (string, bool) { return "", false }
func (m *mintedSource) Minted(name string) bool   { return name == "github" }
func (m *mintedSource) Destination(in *policy.Input) string {
	if in.HTTP != nil && in.HTTP.Route == "github" {
		return "github"
	}
	return ""
}
func (m *mintedSource) ScopeOf(_ string, run credential.Run) (*policy.Credential, string) {
	repos, _ := run.Grants["github_repos"].([]any)
	sc := &policy.Credential{Name: "github", Provider: "github_app"}
	for _, r := range repos {
		sc.Repositories = append(sc.Repositories, r.(string))
	}
	return sc, "fp"
}
func (m *mintedSource) Take(_ context.Context, _ string, run credential.Run, _ *policy.Credential, _ string) (credential.Lease, error) {
	m.runs = append(m.runs, run)
	return m.lease, m.err
}

// The call step of a minted credential: policy's input has the scope, the token taken is the
// run's (its claim's key), the event names the token by its ID, and a provider that cannot
// mint refuses 503 credential_unavailable with its reason and Retry-After.
func TestTakeMintedCredential(t *testing.T) {
	id := identity.Identity{Known: true, Namespace: "agents", Sandbox: "box-1", Claim: "task-1"}
	grants := map[string]any{"github_repos": []any{"acme/widgets"}}
	expires := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		src    *mintedSource
		status int
	}{
		{"minted", &mintedSource{lease: credential.Lease{Value: "ghs_value", ID: "sha256:abc", Provider: "github_app", Expires: expires}}, 0},
		{"provider down", &mintedSource{err: &credential.Unavailable{Credential: "github", Provider: "github_app",
			Reason: "GitHub API unreachable", RetryAfter: 2 * time.Second}}, http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kept := &keptEvents{}
			core, err := call.New(call.Options{Audit: kept, Policy: fixedDecider{policy.Decision{Allow: true, Revision: "r1"}}, Credentials: tc.src})
			require.NoError(t, err)
			in := &policy.Input{Kind: audit.KindHTTPRequest, Identity: id, Grants: grants, HTTP: &policy.HTTP{Route: "github"}}
			var v, inCall string
			var inCallOK bool
			var rf *call.Refusal
			call.Run(context.Background(), core, call.Spec{Kind: audit.KindHTTPRequest, Identity: id}, call.Steps[struct{}]{
				Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) {
					return call.Question{Input: in, Credential: "github"}, nil
				},
				Act: func(ctx context.Context, _ *call.Call, g call.Grant) (struct{}, call.End) {
					v = g.Credential
					inCall, inCallOK = call.CredentialValue(ctx, tc.src, "github")
					return struct{}{}, call.Answered(200)
				},
				Refused: func(r *call.Refusal) struct{} { rf = r; return struct{}{} },
			})
			require.NotNil(t, in.Credential, "policy saw the scope")
			assert.Equal(t, []string{"acme/widgets"}, in.Credential.Repositories)
			require.Len(t, tc.src.runs, 1)
			assert.Equal(t, "agents/claims/task-1", tc.src.runs[0].Key, "the claim's run")
			if tc.status == 0 {
				require.Nil(t, rf)
				assert.Equal(t, "ghs_value", v)
				assert.True(t, inCallOK)
				assert.Equal(t, "ghs_value", inCall, "the call's requests carry the run's token")
				_, ok := call.CredentialValue(context.Background(), tc.src, "github")
				assert.False(t, ok, "a request of no call gets no minted token")
				require.Len(t, kept.evs, 1)
				assert.Equal(t, &audit.CredentialToken{Provider: "github_app", ID: "sha256:abc", Expires: expires}, kept.evs[0].CredentialToken)
				return
			}
			require.NotNil(t, rf)
			assert.Equal(t, call.CodeCredentialUnavailable, rf.Code)
			assert.Equal(t, tc.status, rf.Status())
			assert.Equal(t, 2*time.Second, rf.RetryAfter)
			assert.Contains(t, rf.Reason, `credential "github" (github_app) is unavailable: GitHub API unreachable`)
			require.Len(t, kept.evs, 1)
			assert.Equal(t, tc.status, kept.evs[0].Outcome.Status)
		})
	}
}

// A lifecycle event is an audit event of its own with the run's identity and the token's ID.
func TestCredentialEventIsAnAuditEvent(t *testing.T) {
	core, kept := newKeptCore(t)
	core.CredentialEvent(credential.Event{Kind: credential.EventRevoke, Credential: "github", Provider: "github_app",
		Run: credential.Run{Namespace: "agents", Sandbox: "box-1", Claim: "task-1"}, TokenID: "sha256:abc",
		Expires: time.Unix(0, 0), Reason: "its claim was deleted", Failed: true})
	require.Len(t, kept.evs, 1)
	ev := kept.evs[0]
	assert.Equal(t, audit.KindCredentialRevoke, ev.Kind)
	assert.Equal(t, "task-1", ev.Identity.Claim)
	assert.Equal(t, "its claim was deleted", ev.Decision.Reason)
	assert.Equal(t, call.OutcomeRevokeFailed, ev.Outcome.Error)
	assert.Equal(t, "sha256:abc", ev.CredentialToken.ID)
	assert.NotEmpty(t, ev.ID)
}
