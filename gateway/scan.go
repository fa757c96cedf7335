package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonscan"
)

// An upstream's messages are read with one allocation-free scan where encoding/json would read
// them the same, and left to encoding/json otherwise (a key with escapes or beyond ASCII, which
// it matches without regard to case and Unicode folding).

// errLeaveToJSON ends a scan whose result encoding/json must read.
var errLeaveToJSON = errors.New("leave it to encoding/json")

// asksForInput reports whether raw, a result, may be of resultType "input_required": false
// only when a scan shows it is not; anything the scan leaves to encoding/json (or cannot read)
// may be.
func asksForInput(raw []byte) bool {
	may := false
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.ASCIIKey(key, escaped)
		switch {
		case !ok:
			return errLeaveToJSON
		case string(name) == "resultType":
			if bytes.IndexByte(val, '\\') >= 0 || string(val) == `"`+string(mcp.ResultTypeInputRequired)+`"` {
				may = true
			}
		case bytes.EqualFold(name, []byte("resultType")):
			return errLeaveToJSON // encoding/json would read it as resultType
		}
		return nil
	})
	return may || err != nil
}

// scannedMessage is what scanMessage reads of a message.
type scannedMessage struct {
	Method            string
	ID, Result, Error json.RawMessage
}

// scanMessage reads an upstream's JSON-RPC message as json.Unmarshal into wireMessage would, in
// one scan that does not decode the params; ok is false when it leaves the message to
// encoding/json (a key it might read differently, a repeated member, a value of another type, a
// string with escapes or beyond ASCII, invalid JSON).
func scanMessage(body []byte) (msg scannedMessage, ok bool) {
	var seen [5]bool
	err := jsonscan.Members(body, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.LowerKey(key, escaped)
		if !ok {
			return errLeaveToJSON
		}
		i := slices.Index(messageKeys, string(name))
		switch {
		case i < 0:
			return nil
		case seen[i] || string(val) == "null":
			return errLeaveToJSON
		}
		seen[i] = true
		switch name := string(name); name {
		case "method":
			s, ok := jsonscan.PlainString(val)
			if !ok {
				return errLeaveToJSON
			}
			msg.Method = s
		case "id":
			msg.ID = json.RawMessage(val)
		case "result":
			msg.Result = json.RawMessage(val)
		case "error":
			msg.Error = json.RawMessage(val)
		}
		return nil
	})
	return msg, err == nil
}

var messageKeys = []string{"method", "id", "result", "error", "params"}
