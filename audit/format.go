package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// maxCell caps a table cell; the JSON output has the full values.
const maxCell = 60

// WriteTable writes events as aligned columns: time, kind, sandbox, target, decision, reason,
// status, duration. Values come from sandboxes and upstreams, so control characters are escaped
// (no terminal escape sequences, no broken alignment) and long values are shortened.
func WriteTable(w io.Writer, events []Event) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tKIND\tSANDBOX\tTARGET\tDECISION\tREASON\tSTATUS\tDURATION")
	for i := range events {
		ev := &events[i]
		decision := DecisionDeny
		if ev.Decision.Allow {
			decision = DecisionAllow
		}
		if ev.Decision.WouldDeny != "" {
			decision = "allow (report: " + cell(ev.Decision.WouldDeny) + ")"
		}
		status := "-"
		if ev.Outcome.Status != 0 {
			status = strconv.Itoa(ev.Outcome.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			ev.Time.UTC().Format("2006-01-02T15:04:05.000Z"),
			cell(string(ev.Kind)),
			cell(ev.Identity.Key()),
			cell(targetString(&ev.Target)),
			decision,
			cell(ev.Decision.Reason),
			status,
			formatDuration(ev.Outcome.DurationMS),
		)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write audit table: %w", err)
	}
	return nil
}

// WriteJSONLines writes events one JSON object per line, in the log's encoding.
func WriteJSONLines(w io.Writer, events []Event) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for i := range events {
		if err := enc.Encode(&events[i]); err != nil {
			return fmt.Errorf("write audit events: %w", err)
		}
	}
	return nil
}

// targetString is "upstream/tool" for MCP calls and "METHOD host/path" for HTTP.
func targetString(t *Target) string {
	switch {
	case t.Tool != "":
		return t.Upstream + "/" + t.Tool
	case t.Upstream != "":
		return t.Upstream
	case t.Host != "":
		s := t.Host + t.Path
		if t.Method != "" {
			s = t.Method + " " + s
		}
		return s
	}
	return "-"
}

func formatDuration(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

// cell makes s safe and short for one table cell.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	var b strings.Builder
	n := 0
	for _, r := range s { // invalid UTF-8 comes out as U+FFFD
		if n == maxCell {
			b.WriteString("…")
			break
		}
		switch {
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}
