package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
)

// What the gateway reads of a JSON object it does not decode: its members matched as
// encoding/json matches them (after unescaping, without regard to case), their names, and
// string values read without a decoding where encoding/json would read them as they are.

// ErrNotObject is a value that is not a JSON object.
var ErrNotObject = errors.New("not a JSON object")

// Named calls f with each member of obj, a JSON object, whose key encoding/json reads as one of
// names (after unescaping, without regard to case), with that name's index.
func Named(obj []byte, names []string, f func(i int, val []byte) error) error {
	if len(obj) == 0 || obj[0] != '{' {
		return ErrNotObject
	}
	return Members(obj, func(key []byte, escaped bool, val []byte) error {
		k := key[1 : len(key)-1]
		if escaped {
			var s string
			if json.Unmarshal(key, &s) != nil {
				return nil
			}
			k = []byte(s)
		}
		for i, n := range names {
			if bytes.EqualFold(k, []byte(n)) {
				return f(i, val)
			}
		}
		return nil
	})
}

// Each calls f with each member of obj, a JSON object: its raw key, the name it stands for, and
// its value.
func Each(obj []byte, f func(key []byte, name string, val []byte)) error {
	return Members(obj, func(key []byte, escaped bool, val []byte) error {
		name, err := KeyName(key, escaped)
		if err != nil {
			return err
		}
		f(key, name, val)
		return nil
	})
}

// KeyName is the name a raw member key stands for.
func KeyName(key []byte, escaped bool) (string, error) {
	if !escaped {
		return string(key[1 : len(key)-1]), nil
	}
	var s string
	err := json.Unmarshal(key, &s)
	return s, err
}

// PlainString is a raw JSON string value without its quotes, when it has no escapes and only
// ASCII (which encoding/json decodes to itself).
func PlainString(val []byte) (string, bool) {
	if len(val) < 2 || val[0] != '"' || bytes.IndexByte(val, '\\') >= 0 {
		return "", false
	}
	for _, c := range val {
		if c >= 0x80 {
			return "", false
		}
	}
	return string(val[1 : len(val)-1]), true
}

// String is a raw JSON string's value ("" for anything else).
func String(raw []byte) string {
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	if s, ok := PlainString(raw); ok {
		return s
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}
