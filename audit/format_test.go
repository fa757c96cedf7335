package audit

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

func TestWriteTable(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 123e6, time.UTC)
	events := []Event{
		{Time: at, Kind: KindToolsCall,
			Identity: identity.Identity{Namespace: "team-a", Sandbox: "sb-1", Known: true},
			Target:   Target{Upstream: "github", Tool: "create_issue"},
			Decision: Decision{Allow: true, Reason: "granted"},
			Outcome:  Outcome{Status: 200, DurationMS: 12.5}},
		{Time: at, Kind: KindHTTPRequest,
			Identity: identity.Identity{SourceIP: "10.1.1.1"},
			Target:   Target{Method: "POST", Host: "api.example.com", Path: "/v1/x"},
			Decision: Decision{Reason: "evil\x1b[31mred\ttab\nnewline" + strings.Repeat("x", 100)},
			Outcome:  Outcome{DurationMS: 0.25}},
	}
	var out bytes.Buffer
	require.NoError(t, WriteTable(&out, events))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")

	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"there is a header and one row per event", func(t *testing.T) {
			require.Len(t, lines, 3)
			assert.Regexp(t, `^TIME\s+KIND\s+SANDBOX\s+TARGET\s+DECISION\s+REASON\s+STATUS\s+DURATION$`, lines[0])
		}},
		{"columns are aligned", func(t *testing.T) {
			for _, col := range []string{"KIND", "SANDBOX", "TARGET", "DECISION"} {
				i := strings.Index(lines[0], col)
				assert.NotEqual(t, ' ', rune(lines[1][i]), "row 1 starts a value under %s", col)
				assert.Equal(t, ' ', rune(lines[1][i-1]), "row 1 has a gap before %s", col)
			}
		}},
		{"an MCP row shows sandbox, upstream/tool, status and duration", func(t *testing.T) {
			assert.Regexp(t, `^2025-06-01T12:00:00\.123Z\s+mcp\.tools_call\s+team-a/sb-1\s+github/create_issue\s+allow\s+granted\s+200\s+12\.5ms$`, lines[1])
		}},
		{"an anonymous HTTP row shows the method, host and path", func(t *testing.T) {
			assert.Contains(t, lines[2], "anonymous")
			assert.Contains(t, lines[2], "POST api.example.com/v1/x")
			assert.Contains(t, lines[2], " deny ")
			assert.Regexp(t, `\s-\s+250µs$`, lines[2])
		}},
		{"control characters from a sandbox are escaped, not sent to the terminal", func(t *testing.T) {
			assert.NotContains(t, out.String(), "\x1b")
			assert.Contains(t, lines[2], `evil\x1b[31mred\ttab\nnewline`)
		}},
		{"long values are shortened", func(t *testing.T) {
			assert.Contains(t, lines[2], "x…")
			assert.NotContains(t, lines[2], strings.Repeat("x", 100))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

func TestWriteJSONLinesReproducesTheLogLines(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 3)
	res, err := Query(context.Background(), dir, Filter{})
	require.NoError(t, err)

	var out bytes.Buffer
	require.NoError(t, WriteJSONLines(&out, res.Events))
	log, err := os.ReadFile(filepath.Join(dir, ActiveFile))
	require.NoError(t, err)
	assert.Equal(t, string(log), out.String(), "json output can be verified like the log itself")
}

func TestNewIDIsAUUIDv7(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	at := time.UnixMilli(0x0123456789ab)
	id := newID(at)
	assert.Regexp(t, re, id)
	assert.True(t, strings.HasPrefix(id, "01234567-89ab-"), "the first 48 bits are the Unix milliseconds")
	assert.NotEqual(t, id, newID(at), "the rest is random")
}
