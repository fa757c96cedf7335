package audit

import (
	"math/rand/v2"
	"time"
)

// newID returns a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits, so IDs
// sort roughly by time and collide with negligible probability across writers and restarts.
// The random bits come from math/rand/v2's runtime source (ChaCha8, seeded by the OS, per thread,
// no lock): an ID is an identifier, not a secret, and this keeps Record to one allocation.
func newID(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	b[0], b[1], b[2] = byte(ms>>40), byte(ms>>32), byte(ms>>24)
	b[3], b[4], b[5] = byte(ms>>16), byte(ms>>8), byte(ms)
	r1, r2 := rand.Uint64(), rand.Uint64()
	b[6] = 0x70 | byte(r1>>60)&0x0f // version 7
	b[7] = byte(r1 >> 52)
	b[8] = 0x80 | byte(r2>>56)&0x3f // variant 10
	for i := 9; i < 16; i++ {
		b[i] = byte(r2 >> (8 * (15 - i)))
	}

	const digits = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = digits[c>>4], digits[c&0x0f]
		j += 2
	}
	return string(s[:])
}
