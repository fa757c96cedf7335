package respguard

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// A set of many needles is searched for all at once. The MCP half scrubs every answer of every
// live run's minted tokens (Source.Current: an upstream session may be shared by runs), nine
// needles or so a token, and a search of each needle in turn costs each answer in proportion to
// the runs: with 200 runs, 22 µs a small answer and 51 µs a short streamed one, against 0.8 and
// 3.5 µs with a static key alone (BenchmarkReader/all and static). A set of wideFrom needles or
// more is searched by the needles' first 8 bytes instead (every body needle has MinBodySecret
// bytes or more): at each position of a text one probe of a filter, and a comparison where it
// says a needle may begin, whatever the number of needles: 1.6 and 6.9 µs with the 200 runs'
// (A/B against 67fea2d, interleaved, medians of 5). The search of each needle in turn costs
// about 0.8 µs and 15 ns a needle for the small answer, the wide one about 1.5 µs: they cost the
// same at about 50 needles. Both find the same matches in the same order, and hold back the
// same tails (FuzzWideFindsWhatNarrowFinds).
const wideFrom = 48

// wide indexes a set's body needles by their first 8 bytes, and their shorter prefixes for held.
//
// The forms of many runs' tokens share their first 8 bytes: the hex of "ory_at_X" begins
// "6f72795f" for every run, and so do its base64 forms at each alignment. Compared at every
// position those first 8 bytes occur, a text an upstream filled with them would cost a
// comparison per run at each: so a needle of 16 bytes or more is found by its first 16
// (by16), where the tokens differ; and held looks a suffix up in its bucket sorted (sorted),
// in as many comparisons as the bucket's size has bits.
type wide struct {
	byPrefix map[uint64][]int32    // body needles under 16 bytes (indices), by their first 8 bytes
	by16     map[[2]uint64][]int32 // body needles of 16 bytes or more, by their first 16
	sorted   map[uint64][]int32    // every body needle by its first 8 bytes, in byte order
	short    map[uint64]bool       // every prefix of 1 to 7 bytes of a body needle, by shortKey
	filter   []uint64              // bit bit(k) set for every key k of byPrefix and short
	shift    uint
}

// match is an occurrence of body needle x at index at.
type match struct{ x, at int }

func newWide(body [][]byte) *wide {
	x := &wide{byPrefix: map[uint64][]int32{}, by16: map[[2]uint64][]int32{}, sorted: map[uint64][]int32{}, short: map[uint64]bool{}}
	for i, nd := range body {
		k := binary.LittleEndian.Uint64(nd)
		if len(nd) >= 16 {
			k2 := [2]uint64{k, binary.LittleEndian.Uint64(nd[8:])}
			x.by16[k2] = append(x.by16[k2], int32(i))
		} else {
			x.byPrefix[k] = append(x.byPrefix[k], int32(i))
		}
		x.sorted[k] = append(x.sorted[k], int32(i))
		for l := 1; l < 8; l++ {
			x.short[shortKey(nd[:l])] = true
		}
	}
	for _, b := range x.sorted {
		slices.SortFunc(b, func(i, j int32) int { return bytes.Compare(body[i], body[j]) })
	}
	// About 16 bits a key: a position no needle begins at is passed on one probe, 15 times in 16.
	bitsLog := uint(12)
	for 1<<bitsLog < 16*(len(x.sorted)+len(x.short)) {
		bitsLog++
	}
	x.shift = 64 - bitsLog
	x.filter = make([]uint64, 1<<bitsLog/64)
	for k := range x.sorted {
		x.set(k)
	}
	for k := range x.short {
		x.set(k)
	}
	return x
}

// shortKey is the key of a prefix of 1 to 7 bytes: its bytes and its length.
func shortKey(b []byte) uint64 {
	var k uint64
	for i, c := range b {
		k |= uint64(c) << (8 * i)
	}
	return k | uint64(len(b))<<56
}

func (x *wide) bit(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> x.shift }

func (x *wide) set(k uint64) {
	b := x.bit(k)
	x.filter[b/64] |= 1 << (b % 64)
}

func (x *wide) maybe(k uint64) bool {
	b := x.bit(k)
	return x.filter[b/64]&(1<<(b%64)) != 0
}

// matches appends to ms every occurrence (overlapping ones too) of every needle of body in buf
// that begins before `before`, ordered by needle, then by index: the order in which a search of
// each needle in turn finds them.
func (x *wide) matches(ms []match, buf []byte, before int, body [][]byte) []match {
	first := len(ms)
	for i := 0; i+8 <= len(buf) && i < before; i++ {
		k := binary.LittleEndian.Uint64(buf[i:])
		if !x.maybe(k) {
			continue
		}
		for _, j := range x.byPrefix[k] {
			if bytes.HasPrefix(buf[i:], body[j]) {
				ms = append(ms, match{int(j), i})
			}
		}
		if i+16 <= len(buf) {
			for _, j := range x.by16[[2]uint64{k, binary.LittleEndian.Uint64(buf[i+8:])}] {
				if bytes.HasPrefix(buf[i:], body[j]) {
					ms = append(ms, match{int(j), i})
				}
			}
		}
	}
	slices.SortFunc(ms[first:], func(a, b match) int {
		if a.x != b.x {
			return a.x - b.x
		}
		return a.at - b.at
	})
	return ms
}

// held is Needles.held for a wide set: the longest suffix of tail that a needle begins with
// and is longer than, tried by the suffix's first 8 bytes or, under 8, by its bytes.
func (x *wide) held(tail []byte, body [][]byte) int {
	for i := 0; i+8 <= len(tail); i++ {
		k := binary.LittleEndian.Uint64(tail[i:])
		if !x.maybe(k) {
			continue
		}
		// The needles that begin with p follow one another in byte order, from the first
		// that is not less than p: p itself (not longer than p) or the first longer one.
		p, b := tail[i:], x.sorted[k]
		at, _ := slices.BinarySearchFunc(b, p, func(j int32, p []byte) int { return bytes.Compare(body[j], p) })
		for ; at < len(b) && bytes.HasPrefix(body[b[at]], p); at++ {
			if len(body[b[at]]) > len(p) {
				return len(tail) - i
			}
		}
	}
	for l := min(7, len(tail)); l > 0; l-- {
		if k := shortKey(tail[len(tail)-l:]); x.maybe(k) && x.short[k] {
			return l
		}
	}
	return 0
}

// each calls fn for each occurrence of a body needle in buf that a search of each needle in
// turn, left to right and past each occurrence it found, would find: fn may overwrite what it
// was given, and a later needle is looked for in what fn left.
func (n *Needles) each(buf []byte, fn func(a, b int)) {
	if n.wide == nil {
		for x, h := range n.heads {
			for i := 0; i <= len(buf)-int(h.n); {
				j := n.index(buf[i:], x)
				if j < 0 {
					break
				}
				i += j
				fn(i, i+int(h.n))
				i += int(h.n)
			}
		}
		return
	}
	var arr [8]match
	x, end := -1, 0
	for _, m := range n.wide.matches(arr[:0], buf, len(buf), n.body) {
		nd := n.body[m.x]
		if m.x != x {
			x, end = m.x, 0
		}
		if m.at < end || !bytes.Equal(buf[m.at:m.at+len(nd)], nd) {
			continue // inside the last occurrence of the same needle, or overwritten since
		}
		fn(m.at, m.at+len(nd))
		end = m.at + len(nd)
	}
}

// eachBefore calls fn for every occurrence of a body needle in buf that begins before
// `before`, overlapping ones too, needle by needle and left to right; fn does not change buf.
func (n *Needles) eachBefore(buf []byte, before int, fn func(a, b int)) {
	if n.wide == nil {
		for x, h := range n.heads {
			for i := 0; i < before; {
				j := n.index(buf[i:], x)
				if j < 0 || i+j >= before {
					break
				}
				i += j
				fn(i, i+int(h.n))
				i++
			}
		}
		return
	}
	var arr [8]match
	for _, m := range n.wide.matches(arr[:0], buf, before, n.body) {
		fn(m.at, m.at+len(n.body[m.x]))
	}
}

// firstBefore is the least index before `before` at which a body needle occurs in buf, or -1.
func (n *Needles) firstBefore(buf []byte, before int) int {
	first := -1
	if n.wide == nil {
		for x := range n.heads {
			if j := n.index(buf, x); j >= 0 && j < before && (first < 0 || j < first) {
				first = j
			}
		}
		return first
	}
	var arr [8]match
	for _, m := range n.wide.matches(arr[:0], buf, before, n.body) {
		if first < 0 || m.at < first {
			first = m.at
		}
	}
	return first
}

// contains reports whether s holds a body needle.
func (n *Needles) contains(s string) bool {
	b := []byte(s)
	return n.firstBefore(b, len(b)) >= 0
}

// head is a narrow set's body needle as index first reads it: its length and first two bytes.
type head struct {
	n      uint32
	c0, c1 byte
}

// index is bytes.Index(s, n.body[x]) for a narrow set, which reads the needle's bytes only
// where s holds its first two (Needles.heads says why). Where s holds them often without the
// rest (a text an upstream filled with them), it leaves the rest of s to bytes.Index, whose
// search stays linear there, as bytes.Index itself gives up its first loop
// (FuzzIndexIsBytesIndex holds the two to the same answers).
func (n *Needles) index(s []byte, x int) int {
	h := n.heads[x]
	m := int(h.n)
	t := len(s) - m + 1 // every needle has 2 bytes or more: s[i+1] exists for i < t
	for i, fails := 0, 0; i < t; i++ {
		o := bytes.IndexByte(s[i:t], h.c0)
		if o < 0 {
			return -1
		}
		i += o
		if s[i+1] == h.c1 && bytes.Equal(s[i:i+m], n.body[x]) {
			return i
		}
		if fails++; fails > 4+i>>4 {
			if j := bytes.Index(s[i+1:], n.body[x]); j >= 0 {
				return i + 1 + j
			}
			return -1
		}
	}
	return -1
}
