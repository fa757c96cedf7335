package call

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/limits"
)

// Every code Sandgate makes has a row in the table: a code missing from it would be answered
// as a policy denial (403) whatever it means.
func TestEveryCodeHasAClass(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "refusal.go", nil, 0)
	require.NoError(t, err)
	var names []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "Code") {
					names = append(names, n.Name)
				}
			}
		}
	}
	require.NotEmpty(t, names)
	assert.Len(t, codes, len(names)+4, "codes has one row per Code constant and per limits code")
	for _, c := range classes {
		assert.NotZero(t, c.status)
	}
}

func TestRefusalStatus(t *testing.T) {
	tests := []struct {
		name   string
		code   string
		status int
		anth   string
		openAI string
	}{
		{"a policy's own code is a 403 permission error", "model_not_allowed", http.StatusForbidden, "permission_error", "permission_error"},
		{"a rate limit is a 429 rate-limit error", string(limits.CodeRateLimited), http.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded"},
		{"a limits store that cannot be reached is 503, not 429", string(limits.CodeStoreUnavailable), http.StatusServiceUnavailable, "api_error", "server_error"},
		{"an audit log that cannot be written is 503", CodeAuditUnavailable, http.StatusServiceUnavailable, "api_error", "server_error"},
		{"a name that does not resolve is the upstream's failure, not a denial", CodeResolveFailed, http.StatusBadGateway, "api_error", "server_error"},
		{"a session used from another address answers like an unknown one", CodeSessionNotOwned, http.StatusNotFound, "not_found_error", "not_found_error"},
		{"an inner request for another host is misdirected", CodeHostMismatch, http.StatusMisdirectedRequest, "invalid_request_error", "invalid_request_error"},
		{"an oversized head is 431", CodeHeaderTooLarge, http.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "invalid_request_error"},
		{"a response the upstream cut short is the upstream's failure", CodeUpstreamTruncated, http.StatusBadGateway, "api_error", "server_error"},
		{"an oversized body is 413", CodeBodyTooLarge, http.StatusRequestEntityTooLarge, "request_too_large", "invalid_request_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Refuse(tt.code, "x")
			assert.Equal(t, tt.status, r.Status())
			assert.Equal(t, tt.anth, r.ErrorType(false))
			assert.Equal(t, tt.openAI, r.ErrorType(true))
		})
	}
}
