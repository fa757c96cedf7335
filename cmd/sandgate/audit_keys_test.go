package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
)

// auditKeys runs "sandgate audit keygen" and returns the folder with checkpoint.key,
// checkpoint.pub and chain.key.
func auditKeys(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keys")
	code, out, errOut := auditCLI(t, "keygen", "--dir", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, audit.SigningKeyFile)
	return dir
}

// protectedLog writes 5 events keyed and checkpointed with the keys in keys (every 2 events and
// on Close) and returns the folder and the checkpoints as the process log holds them.
func protectedLog(t *testing.T, keys string, keyed bool) (dir, processLog string) {
	t.Helper()
	dir = t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: dir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	privPEM, err := os.ReadFile(filepath.Join(keys, audit.SigningKeyFile))
	require.NoError(t, err)
	priv, err := audit.ParseSigningKey(privPEM)
	require.NoError(t, err)
	var logBuf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))
	opts := []audit.Option{audit.WithCheckpoints(audit.CheckpointConfig{Key: priv, EveryEvents: 2,
		Published: func(c audit.Checkpoint) { log.Info("audit checkpoint", "checkpoint", c) }})}
	if keyed {
		key, err := audit.ReadKeyFile(filepath.Join(keys, audit.ChainKeyFile))
		require.NoError(t, err)
		opts = append(opts, audit.WithChainKey(key))
	}
	w := audit.NewWriter(sink, opts...)
	for range 5 {
		ev := audit.Event{Kind: audit.KindToolsCall, Identity: identity.Identity{Namespace: "ns", Sandbox: "sb-1", Known: true}}
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
	processLog = filepath.Join(t.TempDir(), "sandgate.log")
	require.NoError(t, os.WriteFile(processLog, logBuf.Bytes(), 0o600))
	return dir, processLog
}

func TestAuditVerifyWithKeysAndCheckpoints(t *testing.T) {
	keys := auditKeys(t)
	otherKeys := auditKeys(t)
	chainKey := filepath.Join(keys, audit.ChainKeyFile)
	pub := filepath.Join(keys, audit.PublicKeyFile)
	keyed, processLog := protectedLog(t, keys, true)
	unkeyed, _ := protectedLog(t, keys, false)

	truncated, truncatedLog := protectedLog(t, keys, true)
	active := filepath.Join(truncated, audit.ActiveFile)
	b, err := os.ReadFile(active)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(b), "\n")
	// Cut the last event and the checkpoint written on Close.
	require.NoError(t, os.WriteFile(active, []byte(strings.Join(lines[:len(lines)-3], "")), 0o600))
	truncatedCheckpoints, err := os.ReadFile(truncatedLog)
	require.NoError(t, err)

	shortKey := filepath.Join(t.TempDir(), "short.key")
	require.NoError(t, os.WriteFile(shortKey, []byte("secret\n"), 0o600))
	cfg := filepath.Join(t.TempDir(), "sandgate.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("audit:\n  file:\n    dir: "+keyed+"\n"+
		"  chain_key_credential: audit-chain\n  checkpoint:\n    signing_key_credential: audit-signing\n"+
		"credentials:\n  - name: audit-chain\n    file: "+chainKey+"\n"+
		"  - name: audit-signing\n    file: "+filepath.Join(keys, audit.SigningKeyFile)+"\n"), 0o600))

	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantOut    string
		wantStderr string
	}{
		{name: "a keyed log verifies with its key file and public key", args: []string{"verify", "--dir", keyed, "--key-file", chainKey, "--public-key", pub},
			wantOut: "ok: 5 events in 1 file, 3 checkpoints (keyed chain)"},
		{name: "--config reads the chain key and the signing key through the credentials", args: []string{"verify", "--config", cfg},
			wantOut: "ok: 5 events in 1 file, 3 checkpoints (keyed chain)"},
		{name: "a keyed log without a key cannot be verified and exits 1", args: []string{"verify", "--dir", keyed},
			wantCode: 1, wantStderr: "the audit log is keyed: verify it with the chain key"},
		{name: "a wrong chain key exits 3 naming the key ids", args: []string{"verify", "--dir", keyed, "--key-file", filepath.Join(otherKeys, audit.ChainKeyFile)},
			wantCode: 3, wantStderr: "wrong chain key"},
		{name: "checkpoints signed by another key exit 3", args: []string{"verify", "--dir", keyed, "--key-file", chainKey, "--public-key", filepath.Join(otherKeys, audit.PublicKeyFile)},
			wantCode: 3, wantStderr: "signed with key id"},
		{name: "an unkeyed log verified with a key exits 4 saying unkeyed", args: []string{"verify", "--dir", unkeyed, "--key-file", chainKey},
			wantCode: 4, wantStderr: "unkeyed: no line is keyed"},
		{name: "the process log's checkpoints agree with an intact log", args: []string{"verify", "--dir", keyed, "--key-file", chainKey, "--public-key", pub, "--checkpoint", processLog},
			wantOut: "ok: 5 events"},
		{name: "a cut-off log without an external checkpoint still verifies (the documented limit)", args: []string{"verify", "--dir", truncated, "--key-file", chainKey, "--public-key", pub},
			wantOut: "ok: 4 events in 1 file, 2 checkpoints"},
		{name: "a cut-off log exits 3 against the process log's checkpoints", args: []string{"verify", "--dir", truncated, "--key-file", chainKey, "--checkpoint", truncatedLog},
			wantCode: 3, wantStderr: "the end of the log was cut off"},
		{name: "--checkpoint - reads the checkpoints from stdin", args: []string{"verify", "--dir", truncated, "--key-file", chainKey, "--public-key", pub, "--checkpoint", "-"},
			stdin: string(truncatedCheckpoints), wantCode: 3, wantStderr: "the end of the log was cut off"},
		{name: "--checkpoint without any checkpoint in it is an error", args: []string{"verify", "--dir", keyed, "--checkpoint", "-"},
			stdin: "nothing here\n", wantCode: 1, wantStderr: "no checkpoint found"},
		{name: "a key file too short to be a secret is refused", args: []string{"verify", "--dir", keyed, "--key-file", shortKey},
			wantCode: 1, wantStderr: "chain key has 6 bytes, want at least 32"},
		{name: "keygen does not replace existing keys", args: []string{"keygen", "--dir", keys},
			wantCode: 1, wantStderr: "--force"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := &cliEnv{stdin: strings.NewReader(tt.stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
			code := run(context.Background(), env, append([]string{"audit"}, tt.args...))
			assert.Equal(t, tt.wantCode, code, "stdout: %s\nstderr: %s", out.String(), errOut.String())
			assert.Contains(t, out.String(), tt.wantOut)
			assert.Contains(t, errOut.String(), tt.wantStderr)
		})
	}
}

func TestAuditWriterOptionsNameTheField(t *testing.T) {
	keys := auditKeys(t)
	signing, err := os.ReadFile(filepath.Join(keys, audit.SigningKeyFile))
	require.NoError(t, err)
	tests := []struct {
		name    string
		audit   config.Audit
		creds   map[string]string
		wantErr string
	}{
		{name: "a chain key and a signing key are accepted",
			audit: config.Audit{ChainKeyCredential: "c", Checkpoint: config.AuditCheckpoint{SigningKeyCredential: "s"}},
			creds: map[string]string{"c": strings.Repeat("k", 32), "s": string(signing)}},
		{name: "a short chain key is refused", audit: config.Audit{ChainKeyCredential: "c"},
			creds: map[string]string{"c": "short"}, wantErr: "audit.chain_key_credential: credential \"c\" has 5 bytes"},
		{name: "a signing key that is not PEM is refused", audit: config.Audit{Checkpoint: config.AuditCheckpoint{SigningKeyCredential: "s"}},
			creds: map[string]string{"s": "not a key"}, wantErr: "audit.checkpoint.signing_key_credential: checkpoint signing key: want a PEM"},
		{name: "an unavailable credential is refused", audit: config.Audit{ChainKeyCredential: "gone"},
			wantErr: "audit.chain_key_credential: credential \"gone\" is not available"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Audit: tt.audit}
			_, err := auditWriterOptions(cfg, credential.FromValues(tt.creds), slog.New(slog.DiscardHandler))
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestServeCheckConfigReadsTheAuditKeys(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "bad.key", "not a PEM key\n")
	cfg := writeFile(t, dir, "sandgate.yaml", "policy:\n  dir: "+repoPath(t, "policies")+"\n"+
		"audit:\n  file:\n    dir: "+filepath.Join(dir, "audit")+"\n  checkpoint:\n    signing_key_credential: signing\n"+
		"credentials:\n  - name: signing\n    file: "+filepath.Join(dir, "bad.key")+"\n")
	code, _, errOut := runCLI(t, nil, "serve", "--config", cfg, "--check-config")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "audit.checkpoint.signing_key_credential: checkpoint signing key: want a PEM")
}
