package telemetry

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestThrottledHandler(t *testing.T) {
	errDown := errors.New("redis unavailable")
	now := time.Unix(1_800_000_000, 0)
	var buf bytes.Buffer
	th := NewThrottle(10*time.Second, func() time.Time { return now })
	log := slog.New(ThrottledHandler(slog.NewTextHandler(&buf, nil), th, func(r slog.Record) bool {
		return r.Level >= slog.LevelWarn && RecordHasError(r, func(err error) bool { return errors.Is(err, errDown) })
	})).With("component", "admission")

	for range 100 {
		log.Warn("shared state unavailable", "err", fmt.Errorf("limits: %w", errDown))
	}
	log.Warn("shared state unavailable", "err", errors.New("a wrong type: not an outage"))
	log.Warn("another message", "err", errDown)
	now = now.Add(10 * time.Second)
	log.Warn("shared state unavailable", "err", errDown)

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	assert.Len(t, lines, 4, buf.String())
	assert.NotContains(t, lines[0], "suppressed", "the first line of an outage is written as it is")
	assert.Contains(t, lines[1], "not an outage", "lines the match does not select are never held back")
	assert.Contains(t, lines[2], "another message", "each message has its own period")
	assert.Contains(t, lines[3], "suppressed=99", "the next line of the message says how many were held back")
	assert.Contains(t, lines[3], "component=admission", "attributes added with With are kept")
}
