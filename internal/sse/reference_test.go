package sse

import (
	"strings"
	"unicode/utf8"
)

// refEvent is an event as the reference dispatches it.
type refEvent struct {
	Type, Data, ID string
	Retry          int64
}

// reference is the event-stream interpretation of the HTML standard, written from its text
// (section "Interpreting an event stream") with nothing left out and nothing optimised: the
// stream is decoded as UTF-8, a single leading U+FEFF is dropped, lines end at CRLF, LF or CR,
// and each line is processed in order. Its events' type is the event type buffer as is (""
// where a browser says "message"), so that it compares with Parser directly.
func reference(stream []byte) []refEvent {
	// "Streams must be decoded using the UTF-8 decode algorithm."
	var runes []rune
	for b := stream; len(b) > 0; {
		r, n := utf8.DecodeRune(b)
		runes = append(runes, r)
		b = b[n:]
	}
	// "One leading U+FEFF BYTE ORDER MARK character must be ignored if any are present."
	if len(runes) > 0 && runes[0] == 0xFEFF {
		runes = runes[1:]
	}
	var (
		out       []refEvent
		data      strings.Builder
		eventType string
		lastID    string
		retry     int64 = -1
		line      []rune
	)
	dispatch := func() {
		// 1. The last event ID string of the source is set to the last event ID buffer.
		// 2. If the data buffer is empty, set the data and event type buffers to "" and return.
		if data.Len() == 0 {
			data.Reset()
			eventType = ""
			return
		}
		// 3. If the data buffer's last character is U+000A LINE FEED, remove it.
		d := strings.TrimSuffix(data.String(), "\n")
		out = append(out, refEvent{Type: eventType, Data: d, ID: lastID, Retry: retry})
		data.Reset()
		eventType = ""
	}
	process := func(field, value string) {
		switch field {
		case "event":
			eventType = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		case "id":
			if !strings.ContainsRune(value, 0) {
				lastID = value
			}
		case "retry":
			if value != "" && strings.Trim(value, "0123456789") == "" {
				var n int64
				ok := true
				for _, c := range value {
					if n > (1<<63-1-int64(c-'0'))/10 {
						ok = false
						break
					}
					n = n*10 + int64(c-'0')
				}
				if ok {
					retry = n
				}
			}
		}
	}
	handle := func(l string) {
		switch {
		case l == "":
			dispatch()
		case l[0] == ':':
		case strings.ContainsRune(l, ':'):
			i := strings.IndexRune(l, ':')
			process(l[:i], strings.TrimPrefix(l[i+1:], " "))
		default:
			process(l, "")
		}
	}
	for i := 0; i < len(runes); i++ {
		switch runes[i] {
		case '\r':
			handle(string(line))
			line = line[:0]
			if i+1 < len(runes) && runes[i+1] == '\n' {
				i++
			}
		case '\n':
			handle(string(line))
			line = line[:0]
		default:
			line = append(line, runes[i])
		}
	}
	// "Once the end of the file is reached, any pending data must be discarded."
	return out
}
