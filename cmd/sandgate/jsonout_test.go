package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// The commands CI runs answer -o json: one JSON document on stdout whatever the verdict, the
// exit code of the text form, nothing on stderr but a usage error.
func TestCIcommandsAnswerJSON(t *testing.T) {
	t.Run("policy test -o json is OPA's JSON report", func(t *testing.T) {
		code, out, errOut := runCLI(t, nil, "policy", "test", "-o", "json", repoPath(t, "policies"))
		require.Equal(t, 0, code, errOut)
		var results []struct {
			Package, Name string
			Fail          bool
			Location      struct{ File string }
		}
		require.NoError(t, json.Unmarshal([]byte(out), &results), out)
		require.NotEmpty(t, results)
		for _, r := range results {
			assert.False(t, r.Fail, "%s %s", r.Package, r.Name)
			assert.Contains(t, r.Location.File, "_test.rego")
		}
	})
	t.Run("a failing policy test is in the report and exits 1", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "p.rego", "package sandgate\n\ndecision := {\"allow\": false}\n")
		writeFile(t, dir, "p_test.rego", "package sandgate_test\n\ntest_allows if data.sandgate.decision.allow\n")
		code, out, _ := runCLI(t, nil, "policy", "test", "-o", "json", dir)
		assert.Equal(t, 1, code)
		var results []struct {
			Name string
			Fail bool
		}
		require.NoError(t, json.Unmarshal([]byte(out), &results), out)
		require.Len(t, results, 1)
		assert.Equal(t, "test_allows", results[0].Name)
		assert.True(t, results[0].Fail)
	})

	intact := auditFixture(t)
	broken := auditFixture(t)
	log := filepath.Join(broken, audit.ActiveFile)
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(log, bytes.Replace(b, []byte("reason-sb-2"), []byte("reason-sb-9"), 1), 0o600))
	keys := auditKeys(t)
	unkeyed, _ := protectedLog(t, keys, false)
	type verdict struct {
		OK, Complete bool
		ExitCode     int `json:"exit_code"`
		Events       int
		Break        *struct {
			File   string
			Line   int
			Reason string
		}
		Unkeyed  *struct{ Reason string }
		Warnings []string
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		check    func(t *testing.T, v verdict)
	}{
		{"an intact log", []string{"--dir", intact}, 0, func(t *testing.T, v verdict) {
			assert.True(t, v.OK)
			assert.True(t, v.Complete)
			assert.Equal(t, 3, v.Events)
			assert.Nil(t, v.Break)
		}},
		{"an edited log names the file and line, exit 3", []string{"--dir", broken}, 3, func(t *testing.T, v verdict) {
			assert.False(t, v.OK)
			require.NotNil(t, v.Break)
			assert.Equal(t, 2, v.Break.Line)
			assert.Contains(t, v.Break.Reason, "hash does not match")
		}},
		{"an unkeyed log under a chain key, exit 4", []string{"--dir", unkeyed, "--key-file", filepath.Join(keys, audit.ChainKeyFile)}, 4, func(t *testing.T, v verdict) {
			assert.True(t, v.OK)
			assert.False(t, v.Complete)
			assert.NotNil(t, v.Unkeyed)
		}},
	} {
		t.Run("audit verify -o json: "+tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, append([]string{"audit", "verify", "-o", "json"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code)
			assert.Empty(t, errOut, "the verdict is in the JSON")
			var v verdict
			require.NoError(t, json.Unmarshal([]byte(out), &v), out)
			assert.Equal(t, tc.wantCode, v.ExitCode)
			tc.check(t, v)
		})
	}

	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "policy: {dir: "+repoPath(t, "policies")+"}\n")
	bad := writeFile(t, dir, "bad.yaml", "listen:\n  mcp: 127.0.0.1:80800\n")
	type check struct {
		Config   string
		Valid    bool
		Offline  bool
		ExitCode int `json:"exit_code"`
		Error    string
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		want     check
	}{
		{"a valid config", []string{"--config", good}, 0, check{Config: good, Valid: true}},
		{"a valid config, offline", []string{"--config", good, "--offline"}, 0, check{Config: good, Valid: true, Offline: true}},
		{"a field mistake names the field", []string{"--config", bad}, 1,
			check{Config: bad, ExitCode: 1, Error: "config " + bad + ": listen.mcp: port 80800 out of range 1-65535"}},
		{"a missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, check{Config: filepath.Join(dir, "none.yaml"), ExitCode: 1}},
	} {
		t.Run("serve --check-config -o json: "+tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, nil, append([]string{"serve", "--check-config", "-o", "json"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code)
			assert.Empty(t, errOut)
			var got check
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			if tc.want.Error == "" && !tc.want.Valid {
				assert.Contains(t, got.Error, "read config")
				got.Error = ""
			}
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("-o without --check-config is a usage error", func(t *testing.T) {
		code, _, errOut := runCLI(t, nil, "serve", "--config", good, "-o", "json")
		assert.Equal(t, 2, code)
		assert.Contains(t, errOut, "-o applies to --check-config only")
	})
}
