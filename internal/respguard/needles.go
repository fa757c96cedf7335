package respguard

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
)

// Values of 4 bytes and more are removed from headers, of MinBodySecret bytes and more from
// bodies: shorter strings occur in ordinary text too often to be overwritten there.
const (
	minHeaderSecret = 4
	// MinBodySecret is the shortest credential value scrubbed from bodies.
	MinBodySecret = 8
	// Marker overwrites a credential in a body, cut or padded with '*' to its length.
	Marker = "[REDACTED-BY-SANDGATE]"
)

// Needles are the byte strings that betray one set of credential values: each value, its hex
// (lower and upper case) and its base64 (standard and URL alphabets, at each of the three
// alignments a value can have inside a longer base64 text, cut to the characters that depend
// on the value alone); and the base64 of each credential header's rendered value (and of its
// last word, "user:{value}" after "Basic ") when the format is not just {value}. JSON and
// percent escapes of any of them are found by the scanner, which reads decoded views too.
type Needles struct {
	// The fields an answer reads come first, together, and every needle's bytes lie in one
	// block (arena): a Sandgate serving many runs holds a set per run (Source.For), and an
	// answer reads its run's set cold, a cache miss per line it touches. Spread over the
	// struct and a block per needle, a small answer's scan cost 2.7 µs with 4,096 runs' sets
	// against 1.1 µs with one static set (BenchmarkReader/cold, small).
	gen    uint64   // the store's generation they were read at (Current's test at each answer)
	header []string // shortest first: a value is compared with those no longer than it
	body   [][]byte
	// heads are the body needles' lengths and first two bytes, in body's order and together:
	// a narrow search reads a needle's bytes only where a text holds its first two (index).
	// Through bytes.Index, each search read the needle's slice and first byte, a cold line
	// each in a run's set: a small answer's scan with 4,096 runs' sets cost 1.83 µs, 1.49
	// with heads, against 1.13 with as many static keys' sets (BenchmarkReader/cold and
	// cold-static, medians of 16 interleaved runs; the streamed answer 5.56 → 5.30 µs).
	heads   []head
	maxBody int // the longest body needle
	minBody int // the shortest
	// first has bit c set when some body needle begins with the byte c, and starts bit
	// pairHash(a, b) when one begins with the bytes a, b: held skips, with a lookup in each,
	// the positions no needle can begin at (most of them). Both are a cache line or less (the
	// exact table of pairs was 8 KiB).
	first  [256 / 64]uint64
	starts [startBits / 64]uint64
	// escapable has bit c set when the short JSON escape \c (\n, \", \\, \/ …) stands for a
	// byte some needle holds, so a text with it must be read decoded.
	escapable [256 / 64]uint64
	// ends has, in the words words of bucket endHash(a, b), bit L-1 set when some body needle
	// longer than L has a, b at indices L-2, L-1: the only lengths (2 and more) of a held
	// suffix that ends in a, b. Keyed by the last byte alone, the words of a model answer had
	// 1.2 lengths each to try against the 12 needles of a static key and a run's token; by the
	// last two, hashed into 256 buckets, 0.2 (BenchmarkHeld, 200 runs' sets: 16.2 ns a word
	// before, 10.0 after, the medians of 5 interleaved runs).
	ends  []uint64
	words int
	// wide searches for the body needles all at once: nil under wideFrom of them.
	wide *wide
	// byFirst lists, for each byte, the body needles that begin with it (indices into body):
	// held asks only those at each position of a window's tail that passed first and starts.
	byFirst [256][]int
	// values are the set's key (sorted), read only when the store's generation changed.
	values []string
}

// escapes reports whether the short JSON escape \c may stand for a byte of a needle.
func (n *Needles) escapes(c byte) bool { return n.escapable[c/64]&(1<<(c%64)) != 0 }

// Empty reports whether there is nothing to scrub from bodies.
func (n *Needles) Empty() bool { return n.maxBody == 0 }

// Source keeps the needles of a credential store's current values, rebuilding them only when
// the values change (a rotated credential applies at the next response).
type Source struct {
	store values
	refs  []*config.CredentialRef // credentials whose rendered header is not just the value
	cur   atomic.Pointer[Needles]
	runs  runSets // For's
	// building is held by the one caller of Current that builds a new set; the others wait
	// for it. Each building its own, every answer in flight when a run's token was minted
	// would build the set of every run's tokens (10 ms at 1,000 runs, BenchmarkBuild).
	building sync.Mutex
	builds   atomic.Int64 // sets Current built, for tests
}

// NewSource reads store's values; refs are the credential references whose rendered header
// value (Bearer …, Basic …) is scrubbed in base64 too.
func NewSource(store *credential.Store, refs ...*config.CredentialRef) *Source {
	s := &Source{store: store}
	for _, r := range refs {
		if r != nil && r.Format != "" && r.Format != "{value}" {
			s.refs = append(s.refs, r)
		}
	}
	return s
}

// Current is the needle set of the store's values now. The store's generation says when they
// changed (a rotated value, a token minted for a run or ended): only then are they read again.
func (s *Source) Current() *Needles {
	gen := s.store.Generation()
	if c := s.cur.Load(); c != nil && c.gen == gen {
		return c
	}
	s.building.Lock()
	defer s.building.Unlock()
	gen = s.store.Generation()
	if c := s.cur.Load(); c != nil && c.gen == gen {
		return c // built by the caller this one waited for
	}
	vals := s.store.Values()
	slices.Sort(vals)
	if c := s.cur.Load(); c != nil && slices.Equal(c.values, vals) {
		c2 := *c
		c2.gen = gen
		s.cur.Store(&c2)
		return &c2
	}
	n := Build(vals, s.rendered())
	n.gen = gen
	s.cur.Store(n)
	s.builds.Add(1)
	return n
}

// rendered are the rendered header values of the static credentials of refs.
func (s *Source) rendered() []string {
	var rendered []string
	for _, r := range s.refs {
		if v, ok := s.store.Get(r.Name); ok {
			rendered = append(rendered, r.Render(v))
		}
	}
	return rendered
}

// Build makes the needles of values and of rendered header values.
func Build(values, rendered []string) *Needles { return build(values, rendered, wideFrom) }

// build is Build with the number of needles from which the set is wide (the tests compare
// both searches on one set).
func build(values, rendered []string, wideAt int) *Needles {
	n := &Needles{values: values}
	seen := map[string]bool{}
	add := func(s string) {
		if s == "" || seen[s] {
			return
		}
		seen[s] = true
		n.header = append(n.header, s)
		if len(s) >= MinBodySecret {
			n.body = append(n.body, []byte(s))
		}
	}
	var encoded []string
	for _, v := range values {
		if len(v) < minHeaderSecret {
			continue
		}
		add(v)
		add(hex.EncodeToString([]byte(v)))
		add(strings.ToUpper(hex.EncodeToString([]byte(v))))
		if len(v) >= MinBodySecret {
			encoded = append(encoded, v)
		}
	}
	for _, r := range rendered {
		if len(r) < MinBodySecret {
			continue
		}
		encoded = append(encoded, r)
		if i := strings.LastIndexByte(r, ' '); i >= 0 && len(r)-i-1 >= MinBodySecret {
			encoded = append(encoded, r[i+1:])
		}
	}
	for _, e := range encoded {
		for _, b := range Base64Forms(e) {
			add(b)
		}
	}
	for i, b := range n.body {
		n.maxBody = max(n.maxBody, len(b))
		if i == 0 || len(b) < n.minBody {
			n.minBody = len(b)
		}
	}
	slices.SortStableFunc(n.header, func(a, b string) int { return len(a) - len(b) })
	n.pack()
	for _, b := range n.body {
		for _, c := range b {
			if e := shortEscapeOf[c]; e != 0 {
				n.escapable[e/64] |= 1 << (e % 64)
			}
		}
	}
	n.escapable['u'/64] |= 1 << ('u' % 64)
	if len(n.body) >= wideAt {
		n.wide = newWide(n.body) // held and the searches read it, not the tables below
	} else {
		n.heads = make([]head, 0, len(n.body))
		n.words = (n.maxBody + 63) / 64
		n.ends = make([]uint64, endBuckets*n.words)
		for i, b := range n.body {
			for l := 1; l < len(b)-1; l++ {
				n.ends[endHash(b[l-1], b[l])*n.words+l/64] |= 1 << (l % 64)
			}
			n.heads = append(n.heads, head{n: uint32(len(b)), c0: b[0], c1: b[1]})
			n.byFirst[b[0]] = append(n.byFirst[b[0]], i)
			n.first[b[0]/64] |= 1 << (b[0] % 64)
			h := pairHash(b[0], b[1])
			n.starts[h/64] |= 1 << (h % 64)
		}
	}
	return n
}

// pack moves the needles' bytes into one block each for the body's and the header's (in the
// order they are searched), so that a set read cold costs a miss per line of needles rather
// than one per needle.
func (n *Needles) pack() {
	size := 0
	for _, b := range n.body {
		size += len(b)
	}
	arena := make([]byte, 0, size)
	for i, b := range n.body {
		at := len(arena)
		arena = append(arena, b...)
		n.body[i] = arena[at:len(arena):len(arena)]
	}
	var sb strings.Builder
	for _, h := range n.header {
		sb.WriteString(h)
	}
	all := sb.String()
	for i, h := range n.header {
		n.header[i], all = all[:len(h)], all[len(h):]
	}
}

// startBits is the size of the starts filter: 512 bits, one cache line, for the dozen first
// pairs of one credential's needles (a few dozen with a run's tokens).
const startBits = 512

// pairHash is the bit of starts that stands for the bytes a, b.
func pairHash(a, b byte) uint {
	return uint(uint32(a)<<8|uint32(b)) * 2654435761 >> 23 % startBits
}

// endBuckets is the number of buckets of ends: 256, the size of the table it replaced (one by
// last byte).
const endBuckets = 256

// endHash is the bucket of ends that holds the lengths of suffixes ending in a, b.
func endHash(a, b byte) int {
	return int(uint32(a)<<8|uint32(b)) * 0x9E3779B1 >> 24 % endBuckets
}

// shortEscapeOf is the character after a backslash that JSON writes for a byte (0: none). An
// array, not a map: Build reads it for every byte of every needle (a map made Build of 1,000
// runs' tokens 27 ms, most of it in map lookups).
var shortEscapeOf = [256]byte{'"': '"', '\\': '\\', '/': '/', '\b': 'b', '\f': 'f', '\n': 'n', '\r': 'r', '\t': 't'}

// Base64Forms are the base64 texts (standard and URL alphabets) that contain v when v sits at
// each of the three byte offsets within a base64-encoded text: only the characters decided by
// v's bytes alone.
func Base64Forms(v string) []string {
	var out []string
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for off := range 3 {
			src := append(make([]byte, off, off+len(v)), v...)
			s := enc.EncodeToString(src)
			skip := []int{0, 2, 3}[off] // characters that hold bits of the offset's bytes
			end := len(src) / 3 * 4     // characters of complete 3-byte groups
			if end-skip >= MinBodySecret {
				out = append(out, s[skip:end])
			}
		}
	}
	return out
}

// Forms are every form of v the guard looks for, for tests that check what a sandbox read.
func Forms(v string) []string {
	n := Build([]string{v}, nil)
	return append([]string(nil), n.header...)
}

// ScrubHeader removes every field of h whose value or name contains a needle; it reports
// whether it removed any. A name is compared without regard to case: net/http writes names
// canonical (Sk-Ant-Real-…), which is a credential still, less its case. So is an announced
// trailer's name, in Response.Trailer before its value arrives.
func (n *Needles) ScrubHeader(h map[string][]string) bool {
	removed := false
	for k, vs := range h {
		if n.headerHit(vs) || n.nameHit(k) {
			delete(h, k)
			removed = true
		}
	}
	return removed
}

// nameHit reports whether a field name holds a needle, whatever its case.
func (n *Needles) nameHit(name string) bool {
	for _, s := range n.header {
		if len(s) > len(name) {
			return false
		}
		if containsFold(name, s) {
			return true
		}
	}
	return false
}

// containsFold reports whether s contains sub under ASCII case folding.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

func (n *Needles) headerHit(vs []string) bool {
	for _, v := range vs {
		for _, s := range n.header {
			if len(s) > len(v) || n.wide != nil && len(s) >= MinBodySecret {
				break // the rest are body needles, which a wide set finds at once
			}
			if strings.Contains(v, s) {
				return true
			}
		}
		if n.wide != nil && len(v) >= MinBodySecret && n.contains(v) {
			return true
		}
		if strings.ContainsAny(v, `%\`) && n.decodedHit([]byte(v)) {
			return true
		}
	}
	return false
}

// decodedHit reports whether b, read as the scanner reads a body (escapes decoded, wrapped
// base64 whole), holds a needle.
func (n *Needles) decodedHit(b []byte) bool {
	var s Scanner
	s.Reset(n, false, nil)
	s.scan(bytes.Clone(b), true)
	return s.hits > 0
}

// ScrubString is s with every needle (in any form the scanner reads) overwritten, for text
// bound for a sandbox, a log or an event that did not pass a stream (an upstream's error
// message).
func (n *Needles) ScrubString(s string) (string, bool) {
	if n.Empty() || len(s) < MinBodySecret {
		return s, false
	}
	b := []byte(s)
	var sc Scanner
	sc.Reset(n, false, nil)
	sc.scan(b, true)
	if sc.hits == 0 {
		return s, false
	}
	return string(b), true
}

// Betrays reports whether b holds a needle in any form the scanner reads, pieces of an event
// stream included (b is not changed): what the tests' check of everything sandboxes read uses.
func (n *Needles) Betrays(b []byte) bool {
	if n.Empty() {
		return false
	}
	var s Scanner
	s.Reset(n, true, nil)
	s.Scan(bytes.Clone(b), 0, true)
	return s.hits > 0
}
