package grants_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/test/redistest"
)

const token = "s3cret-admin-token"

func do(t *testing.T, h http.Handler, method, path, auth, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	if rec.Body.Len() > 0 {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), "body %q", rec.Body.String())
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	}
	return rec.Code, out
}

func TestHandler(t *testing.T) {
	bearer := "Bearer " + token
	cases := []struct {
		name, method, path, auth, body string
		wantStatus                     int
		wantError                      string
	}{
		{"no token is refused", "GET", "/v1/grants/team-a/alice", "", "", 401, "missing or wrong admin bearer token"},
		{"a wrong token is refused", "GET", "/v1/grants/team-a/alice", "Bearer nope", "", 401, "missing or wrong"},
		{"a token of another scheme is refused", "GET", "/v1/grants/team-a/alice", "Basic " + token, "", 401, "missing or wrong"},
		{"an unknown route is refused before it is routed", "GET", "/v1/nothing", "", "", 401, "missing or wrong"},
		{"an unknown route with a token is 404", "GET", "/v1/nothing", bearer, "", 404, "no route for GET /v1/nothing"},
		{"a put stores a grant", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": {"name": "acme/widgets"}, "ttl": "30m"}`, 200, ""},
		{"a body that is not JSON is a 400 with the reason", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": `, 400, `body is not {"value": <json>, "ttl": "30m"}`},
		{"an unknown body field is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1, "ttl": "1m", "expires": 3}`, 400, `unknown field "expires"`},
		{"trailing data after the body is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1, "ttl": "1m"} {}`, 400, "data after the JSON object"},
		{"a missing value is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"ttl": "1m"}`, 400, `"value" is required`},
		{"a missing ttl is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1}`, 400, `"ttl" is required`},
		{"a ttl that is no duration is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1, "ttl": "soon"}`, 400, `"ttl" "soon" is not a duration`},
		{"a ttl over the maximum is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1, "ttl": "48h"}`, 400, "longer than the maximum of 24h0m0s"},
		{"a negative ttl is a 400", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": 1, "ttl": "-1m"}`, 400, "ttl must be positive"},
		{"a bad grant name is a 400", "PUT", "/v1/grants/team-a/alice/re$po", bearer, `{"value": 1, "ttl": "1m"}`, 400, `name "re$po" may contain only`},
		{"a namespace that is no Kubernetes name is a 400", "GET", "/v1/grants/Team_A/alice", bearer, "", 400, `namespace "Team_A" is not a Kubernetes name`},
		{"an oversized body is a 413", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": "` + strings.Repeat("x", 80<<10) + `", "ttl": "1m"}`, 413, "body is larger than"},
		{"an oversized value is a 413", "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": "` + strings.Repeat("x", 64<<10) + `", "ttl": "1m"}`, 413, "more than the maximum of 65536"},
		{"delete of one grant answers 204", "DELETE", "/v1/grants/team-a/alice/repo", bearer, "", 204, ""},
		{"delete of a sandbox answers 204", "DELETE", "/v1/grants/team-a/alice", bearer, "", 204, ""},
		{"a wrong method is refused", "POST", "/v1/grants/team-a/alice", bearer, "", 405, ""},
		{"a put by claim stores a grant", "PUT", "/v1/grants/team-a/claims/task-2/repo", bearer, `{"value": "acme/widgets", "ttl": "30m"}`, 200, ""},
		{"a claim that is no Kubernetes name is a 400", "PUT", "/v1/grants/team-a/claims/Task_2/repo", bearer, `{"value": 1, "ttl": "1m"}`, 400, `claim "Task_2" is not a Kubernetes name`},
		{"get by claim answers 200", "GET", "/v1/grants/team-a/claims/task-2", bearer, "", 200, ""},
		{"delete of one claim grant answers 204", "DELETE", "/v1/grants/team-a/claims/task-2/repo", bearer, "", 204, ""},
		{"delete of a claim answers 204", "DELETE", "/v1/grants/team-a/claims/task-2", bearer, "", 204, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := grants.NewHandler(grants.NewMemory(), func() string { return token })
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tc.wantStatus, rec.Code, rec.Body.String())
			if tc.wantError != "" {
				var out map[string]string
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
				assert.Contains(t, out["error"], tc.wantError)
			}
		})
	}
}

// TestHandlerClaimGrants: grants put by claim are stored under the claim's key, apart from a
// sandbox's, and deleted with the claim.
func TestHandlerClaimGrants(t *testing.T) {
	store := grants.NewMemory()
	h := grants.NewHandler(store, func() string { return token })
	bearer := "Bearer " + token
	ctx := context.Background()

	status, out := do(t, h, "PUT", "/v1/grants/team-a/claims/task-2/repo", bearer, `{"value": "acme/widgets", "ttl": "30m"}`)
	require.Equal(t, 200, status, out)
	assert.Equal(t, "team-a/task-2", out["claim"])
	g, err := store.Get(ctx, grants.ClaimKey("team-a", "task-2"))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"repo": "acme/widgets"}, g)
	g, err = store.Get(ctx, "team-a/task-2")
	require.NoError(t, err)
	assert.Empty(t, g, "a sandbox named like the claim does not get the claim's grants")

	status, out = do(t, h, "GET", "/v1/grants/team-a/claims/task-2", bearer, "")
	require.Equal(t, 200, status)
	assert.Equal(t, map[string]any{"grants": map[string]any{"repo": "acme/widgets"}}, out)
	status, _ = do(t, h, "DELETE", "/v1/grants/team-a/claims/task-2", bearer, "")
	require.Equal(t, 204, status)
	g, err = store.Get(ctx, grants.ClaimKey("team-a", "task-2"))
	require.NoError(t, err)
	assert.Empty(t, g)
}

func TestHandlerRefusesEverythingWithoutAConfiguredToken(t *testing.T) {
	h := grants.NewHandler(grants.NewMemory(), func() string { return "" })
	status, _ := do(t, h, "GET", "/v1/grants/team-a/alice", "Bearer ", "")
	assert.Equal(t, http.StatusUnauthorized, status)
}

func TestHandlerRoundTripAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	replicaA := grants.NewHandler(grants.NewRedis(srv.Client(t), "sg:"), func() string { return token })
	replicaB := grants.NewHandler(grants.NewRedis(srv.Client(t), "sg:"), func() string { return token })
	bearer := "Bearer " + token

	status, out := do(t, replicaA, "PUT", "/v1/grants/team-a/alice/repo", bearer, `{"value": {"name": "acme/widgets"}, "ttl": "30m"}`)
	require.Equal(t, 200, status, out)
	assert.Equal(t, "team-a/alice", out["sandbox"])

	status, out = do(t, replicaB, "GET", "/v1/grants/team-a/alice", bearer, "")
	require.Equal(t, 200, status)
	assert.Equal(t, map[string]any{"grants": map[string]any{"repo": map[string]any{"name": "acme/widgets"}}}, out)

	status, _ = do(t, replicaB, "DELETE", "/v1/grants/team-a/alice", bearer, "")
	require.Equal(t, 204, status)
	g, err := grants.NewRedis(srv.Client(t), "sg:").Get(context.Background(), "team-a/alice")
	require.NoError(t, err)
	assert.Empty(t, g)

	srv.Stop()
	start := time.Now()
	status, out = do(t, replicaA, "GET", "/v1/grants/team-a/alice", bearer, "")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, out["error"], "grant store unavailable")
	assert.Less(t, time.Since(start), 3*time.Second)
}
