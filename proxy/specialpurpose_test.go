package proxy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"io/fs"
	"math/big"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sharedRegistryCSV is the project's special-purpose address table, beside the clone.
const sharedRegistryCSV = "../../shared/data/special-purpose-addresses.csv"

// registryRow is one row of the CSV, read independently of the generated Go table.
type registryRow struct {
	prefix              netip.Prefix
	family, name, rfc   string
	reachable, embedsV4 string
}

func readRegistryCSV(t testing.TB, path string) []registryRow {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	r := csv.NewReader(bytes.NewReader(b))
	r.Comment = '#'
	recs, err := r.ReadAll()
	require.NoError(t, err)
	rows := make([]registryRow, 0, len(recs))
	for _, rec := range recs {
		require.Len(t, rec, 6, "row %q", rec)
		rows = append(rows, registryRow{netip.MustParsePrefix(rec[0]), rec[1], rec[2], rec[3], rec[4], rec[5]})
	}
	return rows
}

// TestSpecialPurposeTableCoversRegistry holds the generated table to the shared CSV: every row
// is in the Go table with its name, RFC, reachability and embedding, and nothing else is. It also
// holds this package's testdata copy (which the fuzz reference reads) to the shared file.
func TestSpecialPurposeTableCoversRegistry(t *testing.T) {
	shared, err := os.ReadFile(sharedRegistryCSV)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s is absent (the shared folder is expected beside the clone, as in CI); cannot check the table against the registry", sharedRegistryCSV)
	}
	require.NoError(t, err)
	local, err := os.ReadFile("testdata/special-purpose-addresses.csv")
	require.NoError(t, err)
	assert.Equal(t, string(shared), string(local), "proxy/testdata/special-purpose-addresses.csv is a copy of %s; copy it again and run go generate", sharedRegistryCSV)

	rows := readRegistryCSV(t, sharedRegistryCSV)
	reach := map[string]reachability{"yes": reachableYes, "no": reachableNo, "na": reachableNA}
	require.Len(t, specialPurpose, len(rows), "the Go table and the CSV have different row counts; run go generate in proxy/")
	for i, row := range rows {
		b := specialPurpose[i]
		assert.Equal(t, row.prefix, b.Prefix, "row %d", i)
		assert.Equal(t, row.family == "4", b.Prefix.Addr().Is4(), "row %d %s family", i, row.prefix)
		assert.Equal(t, row.name, b.Name, "row %d %s name", i, row.prefix)
		assert.Equal(t, row.rfc, b.RFC, "row %d %s RFC", i, row.prefix)
		assert.Equal(t, reach[row.reachable], b.Reachable, "row %d %s globally reachable", i, row.prefix)
		assert.Equal(t, row.embedsV4 != "", b.Embeds != embedNone, "row %d %s embeds IPv4", i, row.prefix)
		assert.True(t, b.Reason != "" || row.prefix == netip.MustParsePrefix("::ffff:0:0/96"), "row %d %s has no reason", i, row.prefix)
	}
}

// TestClassifyEveryRegistryEntry denies the first, a middle and the last address of every block
// with that block's reason. Addresses of a more specific block inside it are that block's
// business, so the samples step around them. Treatments that are not a plain denial:
//   - IPv4-mapped (::ffff:0:0/96): decided as the IPv4 address it is, so the reason (or the
//     allowance) is that of the IPv4 address.
//   - Forms that embed IPv4 (NAT64, 6to4, Teredo, IPv4-compatible, SIIT): a special embedded
//     IPv4 address is denied with its own reason; otherwise the block's reason.
//   - Globally reachable blocks (PCP/TURN/DNS-SD anycast, AS112, AMT, ORCHIDv2, DETs, the
//     well-known NAT64 prefix): denied like the rest; a sandbox has no business there.
//   - Metadata endpoints inside a block: DenyMetadata.
func TestClassifyEveryRegistryEntry(t *testing.T) {
	g := &DialGuard{}
	rows := readRegistryCSV(t, "testdata/special-purpose-addresses.csv")
	for _, row := range rows {
		b := blockByPrefix(t, row.prefix)
		for _, pos := range []string{"first", "middle", "last"} {
			a, ok := sampleAddr(rows, row.prefix, pos)
			if !ok {
				continue // every address of the block belongs to a more specific block
			}
			t.Run(row.prefix.String()+" "+row.name+" "+pos+" "+a.String(), func(t *testing.T) {
				want := b.Reason
				if v4s, _ := embeddedIPv4(a, b, nil); len(v4s) > 0 {
					for i := len(v4s) - 1; i >= 0; i-- {
						if r := g.Classify(v4s[i], false); r != "" {
							want = r
						}
					}
				}
				for _, m := range metadataAddrs {
					if a == m {
						want = DenyMetadata
					}
				}
				assert.Equal(t, want, g.Classify(a, false))
			})
		}
	}
}

func blockByPrefix(t testing.TB, p netip.Prefix) *specialBlock {
	for i := range specialPurpose {
		if specialPurpose[i].Prefix == p {
			return &specialPurpose[i]
		}
	}
	t.Fatalf("%s is not in the Go table; run go generate in proxy/", p)
	return nil
}

// sampleAddr returns the first, middle or last address of p that no more specific row covers.
func sampleAddr(rows []registryRow, p netip.Prefix, pos string) (netip.Addr, bool) {
	first, last := prefixRange(p)
	var start *big.Int
	switch pos {
	case "first":
		start = first
	case "last":
		start = last
	default:
		start = new(big.Int).Rsh(new(big.Int).Add(first, last), 1)
	}
	step := big.NewInt(1)
	if pos == "last" {
		step = big.NewInt(-1)
	}
	n := new(big.Int).Set(start)
	for n.Cmp(first) >= 0 && n.Cmp(last) <= 0 {
		a := bigToAddr(n, p.Addr().Is4())
		inner := innerRow(rows, p, a)
		if !inner.IsValid() {
			return a, true
		}
		// Jump past the inner block in the walking direction.
		lo, hi := prefixRange(inner)
		if step.Sign() > 0 {
			n = hi.Add(hi, step)
		} else {
			n = lo.Add(lo, step)
		}
	}
	return netip.Addr{}, false
}

// innerRow is the widest row strictly inside p that contains a.
func innerRow(rows []registryRow, p netip.Prefix, a netip.Addr) netip.Prefix {
	var best netip.Prefix
	for _, r := range rows {
		if r.prefix.Bits() > p.Bits() && r.prefix.Contains(a) && (!best.IsValid() || r.prefix.Bits() < best.Bits()) {
			best = r.prefix
		}
	}
	return best
}

func prefixRange(p netip.Prefix) (first, last *big.Int) {
	first = new(big.Int).SetBytes(p.Masked().Addr().AsSlice())
	host := p.Addr().BitLen() - p.Bits()
	last = new(big.Int).Add(first, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(host)), big.NewInt(1)))
	return first, last
}

func bigToAddr(n *big.Int, is4 bool) netip.Addr {
	if is4 {
		var b [4]byte
		n.FillBytes(b[:])
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	n.FillBytes(b[:])
	return netip.AddrFrom16(b)
}

// registryReference decides allow/deny straight from the CSV rows, without the Go table or the
// guard's code: it is the specification FuzzClassify holds Classify to.
type registryReference struct {
	rows               []registryRow
	allowed, denied    []netip.Prefix
	hardAddrs          []netip.Addr
	hardPfx            []netip.Prefix // never opened: this network, unspecified, multicast
	global, ipv4Mapped netip.Prefix
}

func newRegistryReference(t testing.TB, allowed, denied []string) *registryReference {
	ref := &registryReference{
		rows:       readRegistryCSV(t, "testdata/special-purpose-addresses.csv"),
		global:     netip.MustParsePrefix("2000::/3"),
		ipv4Mapped: netip.MustParsePrefix("::ffff:0:0/96"),
	}
	for _, s := range allowed {
		ref.allowed = append(ref.allowed, netip.MustParsePrefix(s))
	}
	for _, s := range denied {
		ref.denied = append(ref.denied, netip.MustParsePrefix(s))
	}
	for _, s := range []string{"169.254.169.254", "169.254.170.2", "169.254.170.23", "fd00:ec2::254", "fd00:ec2::23", "100.100.100.200", "192.0.0.192", "255.255.255.255", "::"} {
		ref.hardAddrs = append(ref.hardAddrs, netip.MustParseAddr(s))
	}
	for _, s := range []string{"0.0.0.0/8", "224.0.0.0/4", "ff00::/8"} {
		ref.hardPfx = append(ref.hardPfx, netip.MustParsePrefix(s))
	}
	return ref
}

// allow reports whether a may be dialed (allow_private off).
func (ref *registryReference) allow(a netip.Addr) bool {
	a16 := netip.AddrFrom16(a.As16()) // IPv4 as ::ffff:a.b.c.d
	if ref.ipv4Mapped.Contains(a16) {
		return ref.allowV4(netip.AddrFrom4(a16.As4()))
	}
	raw := a16.As16()
	for _, h := range ref.hardAddrs {
		if a16 == h {
			return false
		}
	}
	for _, p := range ref.hardPfx {
		if p.Contains(a16) {
			return false
		}
	}
	// The most specific row decides; an embedding row checks its IPv4 addresses first.
	var best *registryRow
	for i := range ref.rows {
		r := &ref.rows[i]
		if r.family == "6" && r.prefix.Contains(a16) && (best == nil || r.prefix.Bits() > best.prefix.Bits()) {
			best = r
		}
	}
	if best == nil {
		return (ref.global.Contains(a16) || ref.opened(a16, netip.PrefixFrom(a16, 8).Masked())) && !ref.inDenied(a16)
	}
	v4 := func(b []byte) netip.Addr { return netip.AddrFrom4([4]byte(b)) }
	var embedded []netip.Addr
	switch {
	case best.embedsV4 == "":
	case strings.HasPrefix(best.embedsV4, "last 32 bits"):
		embedded = append(embedded, v4(raw[12:16]))
	case strings.HasPrefix(best.embedsV4, "bits 16-47"):
		embedded = append(embedded, v4(raw[2:6]))
	case strings.HasPrefix(best.embedsV4, "client IPv4 = bits 96-127 XOR 0xffffffff"):
		c := raw[12:16]
		embedded = append(embedded, netip.AddrFrom4([4]byte{c[0] ^ 0xff, c[1] ^ 0xff, c[2] ^ 0xff, c[3] ^ 0xff}), v4(raw[4:8]))
	case strings.HasPrefix(best.embedsV4, "RFC6052 position"):
		// Only the /96 length is exercised by the fuzz configuration.
		found := false
		for _, p := range ref.allowed {
			if p.Bits() == 96 && p.Contains(a16) && best.prefix.Contains(p.Addr()) {
				embedded, found = append(embedded, v4(raw[12:16])), true
			}
		}
		if !found {
			return false
		}
	default:
		panic("reference does not know the embedding " + best.embedsV4)
	}
	for _, e := range embedded {
		if !ref.allowV4(e) {
			return false
		}
	}
	return ref.opened(a16, best.prefix) && !ref.inDenied(a16)
}

func (ref *registryReference) allowV4(a netip.Addr) bool {
	for _, h := range ref.hardAddrs {
		if a == h {
			return false
		}
	}
	for _, p := range ref.hardPfx {
		if p.Contains(a) {
			return false
		}
	}
	var best *registryRow
	for i := range ref.rows {
		r := &ref.rows[i]
		if r.family == "4" && r.prefix.Contains(a) && (best == nil || r.prefix.Bits() > best.prefix.Bits()) {
			best = r
		}
	}
	return (best == nil || ref.opened(a, best.prefix)) && !ref.inDenied(a)
}

// opened reports whether an allowed prefix containing a lies inside block.
func (ref *registryReference) opened(a netip.Addr, block netip.Prefix) bool {
	for _, p := range ref.allowed {
		if p.Contains(a) && p.Bits() >= block.Bits() && block.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func (ref *registryReference) inDenied(a netip.Addr) bool {
	for _, p := range ref.denied {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

var knownReasons = map[DenyReason]bool{
	DenyLoopback: true, DenyPrivate: true, DenyLinkLocal: true, DenyCGNAT: true, DenyMetadata: true,
	DenyUnspecified: true, DenyMulticast: true, DenyBroadcast: true, DenyReserved: true,
	DenyProtocolAssignment: true, DenyAnycastService: true, DenyDocumentation: true, DenyBenchmarking: true,
	DenyDiscard: true, DenyORCHID: true, DenySRv6: true, DenySiteLocal: true, DenyNAT64: true,
	Deny6to4: true, DenyTeredo: true, DenyIPv4Compatible: true, DenyIPv4Translated: true, DenyDeniedCIDR: true,
}

// FuzzClassify holds Classify to registryReference on any address, once with the default
// configuration and once with every translation block opened by allowed_cidrs (so that the
// embedded IPv4 address alone decides). Input: sel < number of CSV rows places the fuzzed bytes
// inside that row's prefix; otherwise the bytes are the address (4 bytes IPv4, else IPv6).
func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		"93.184.216.34", "10.0.0.1", "169.254.169.254", "100.100.100.200", "255.255.255.255", "0.0.0.0", "192.0.0.9",
		"2606:4700::1111", "::1", "::", "::127.0.0.1", "::ffff:0:a9fe:a9fe", "64:ff9b::a9fe:a9fe", "64:ff9b::5db8:d822",
		"64:ff9b:1::5db8:d822", "2002:7f00:1::", "2002:5db8:d822::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
		"2001:0:a00:1::a247:27dd", "2001:1::1", "2001:20::1", "fd00:ec2::254", "fec0::1", "ff02::1", "4000::1", "3fff::1", "5f00::1",
	} {
		f.Add(uint8(255), netip.MustParseAddr(s).AsSlice())
	}
	for i := 0; i < 60; i++ {
		f.Add(uint8(i), []byte{0x7f, 0, 0, 1})
	}
	ref := newRegistryReference(f, nil, []string{"100.128.0.0/16"})
	tunnels := []string{"::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1:ab::/96", "2001::/32", "2002::/16"}
	refOpen := newRegistryReference(f, tunnels, []string{"100.128.0.0/16"})
	g := &DialGuard{denied: []netip.Prefix{netip.MustParsePrefix("100.128.0.0/16")}}
	gOpen := &DialGuard{denied: g.denied}
	for _, s := range tunnels {
		gOpen.allowed = append(gOpen.allowed, netip.MustParsePrefix(s))
	}
	f.Fuzz(func(t *testing.T, sel uint8, b []byte) {
		var a netip.Addr
		if int(sel) < len(ref.rows) {
			p := ref.rows[sel].prefix
			raw := make([]byte, p.Addr().BitLen()/8)
			copy(raw, b)
			base, mask := p.Addr().AsSlice(), p.Bits()
			for i := range raw {
				keep := min(max(mask-8*i, 0), 8) // prefix bits in this byte
				m := byte(0xff << (8 - keep))
				raw[i] = base[i]&m | raw[i]&^m
			}
			a, _ = netip.AddrFromSlice(raw)
		} else if len(b) == 4 || len(b) == 16 {
			a, _ = netip.AddrFromSlice(b)
		} else {
			return
		}
		for _, c := range []struct {
			g   *DialGuard
			ref *registryReference
		}{{g, ref}, {gOpen, refOpen}} {
			r := c.g.Classify(a, false)
			if (r == "") != c.ref.allow(a) {
				t.Fatalf("Classify(%s) = %q, but the registry reference says allow=%v (allowed_cidrs %v)", a, r, c.ref.allow(a), c.g.allowed)
			}
			if r != "" && !knownReasons[r] {
				t.Fatalf("Classify(%s) = %q, not a known reason", a, r)
			}
			if a.Is4() && c.g.Classify(netip.AddrFrom16(a.As16()), false) != r {
				t.Fatalf("Classify(%s) differs from its IPv4-mapped form", a)
			}
			if rp := c.g.Classify(a, true); rp == DenyLoopback || rp == DenyPrivate || rp == DenyLinkLocal || rp == DenyCGNAT || rp == DenyDeniedCIDR {
				t.Fatalf("Classify(%s, allowPrivate) = %q, which allow_private lifts", a, rp)
			}
		}
	})
}
