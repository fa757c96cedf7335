package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync"
)

// A tools/call's arguments reach the upstream as the sandbox wrote them (relayparams.go), and
// policy reads those same bytes (input.mcp.arguments), numbers exact: decodeArguments
// (forward.go) reads them with an argsDecoder, as a fresh json.Decoder with UseNumber would.

// argsDecoder reads arguments with numbers as written (json.Number). A json.Decoder reads a
// stream of values; an argsDecoder's stream is each call's arguments in turn (src is reset to
// the next), so a call makes neither a decoder nor its buffer: ~850 B of every tools/call.
// After a value is decoded whole and nothing is left of it, the stream is at the start of the
// next value, as a fresh decoder's is (TestArgsDecoderAgreesWithAFreshOne); a decoder that
// failed or did not end with its value is not used again.
type argsDecoder struct {
	src bytes.Reader
	dec *json.Decoder
	ok  bool // at the start of a value: decode may be called
}

var argsDecoders = sync.Pool{New: func() any { return newArgsDecoder() }}

func newArgsDecoder() *argsDecoder {
	d := &argsDecoder{ok: true}
	d.dec = json.NewDecoder(&d.src)
	d.dec.UseNumber()
	return d
}

// decode reads raw, one JSON value, as an object; after an error d must not be used again.
func (d *argsDecoder) decode(raw []byte) (map[string]any, error) {
	if !d.ok {
		return nil, errors.New("argsDecoder used after a failure")
	}
	d.src.Reset(raw)
	from := d.dec.InputOffset()
	var args map[string]any
	err := d.dec.Decode(&args)
	if err == nil && (d.src.Len() > 0 || d.dec.InputOffset()-from != int64(len(raw))) {
		// Bytes after the value, read or not: decoded by a fresh decoder as before, which reads
		// the first value and leaves the rest.
		d.ok = false
		return newArgsDecoder().decodeOnce(raw)
	}
	if err != nil {
		d.ok = false
		return nil, err
	}
	return args, nil
}

// decodeOnce is decode with a decoder that is then dropped.
func (d *argsDecoder) decodeOnce(raw []byte) (map[string]any, error) {
	d.src.Reset(raw)
	var args map[string]any
	err := d.dec.Decode(&args)
	d.ok = false
	return args, err
}
