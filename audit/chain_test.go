package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/jsonenc"
)

var (
	testChainKey  = []byte(strings.Repeat("chain-key-", 4))
	otherChainKey = []byte(strings.Repeat("other-key-", 4))
	testSignKey   = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	otherSignKey  = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	testPublicKey = testSignKey.Public().(ed25519.PublicKey)
)

// rechainPlain rewrites lines as someone without the chain key would after an edit: every
// prev_hash and hash recomputed with plain SHA-256.
func rechainPlain(t *testing.T, lines [][]byte) [][]byte {
	t.Helper()
	out := make([][]byte, len(lines))
	prev := ""
	for i, l := range lines {
		j := bytes.LastIndex(l, []byte(prevHashKey))
		require.Positive(t, j)
		buf := append([]byte{}, l[:j]...)
		buf = append(buf, `,"prev_hash":`...)
		buf = jsonenc.AppendString(buf, prev)
		buf = append(buf, emptyHashSuffix...)
		var err error
		buf, prev, err = plainChain.seal(buf, 0)
		require.NoError(t, err)
		out[i] = buf
	}
	return out
}

// dropKind removes the lines of one record kind.
func dropKind(lines [][]byte, kind string) [][]byte {
	var out [][]byte
	for _, l := range lines {
		if lineKind(l) != kind {
			out = append(out, l)
		}
	}
	return out
}

func TestKeyedChain(t *testing.T) {
	const events = 6
	keyed := []Option{WithChainKey(testChainKey)}
	tests := []struct {
		name string
		// write builds the log; tamper (optional) changes audit.log's lines.
		write  func(t *testing.T, cfg FileConfig)
		tamper func(t *testing.T, lines [][]byte) [][]byte
		key    []byte
		// wantErr is an error Verify returns; wantBreak a reason of the break; wantUnkeyed says
		// the report flags unkeyed lines. All empty: the log verifies completely.
		wantErr     error
		wantBreak   string
		wantUnkeyed bool
		wantEvents  int
	}{
		{
			name:       "a keyed log verifies with its key",
			write:      func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			key:        testChainKey,
			wantEvents: events,
		},
		{
			name:  "an event deleted and the plain SHA-256 chain recomputed fails under the key",
			write: func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			tamper: func(t *testing.T, lines [][]byte) [][]byte {
				return rechainPlain(t, append(lines[:3:3], lines[4:]...))
			},
			key:       testChainKey,
			wantBreak: "under the chain key: the line was edited",
		},
		{
			name:  "an event deleted and the whole log rewritten unkeyed, marker dropped, is reported unkeyed",
			write: func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			tamper: func(t *testing.T, lines [][]byte) [][]byte {
				lines = dropKind(lines, KindChain)
				return rechainPlain(t, append(lines[:3:3], lines[4:]...))
			},
			key:         testChainKey,
			wantUnkeyed: true,
			wantEvents:  events - 1,
		},
		{
			name:      "a keyed log and the wrong key fails naming both key ids",
			write:     func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			key:       otherChainKey,
			wantBreak: "wrong chain key: the log is keyed with key id " + ChainKeyID(testChainKey) + ", the given key has id " + ChainKeyID(otherChainKey),
		},
		{
			name:    "a keyed log without a key cannot be verified",
			write:   func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			wantErr: ErrChainKeyNeeded,
		},
		{
			name:       "an old unkeyed log verifies without a key as before",
			write:      func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events) },
			wantEvents: events,
		},
		{
			name:        "an old unkeyed log verified with a key is reported unkeyed",
			write:       func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events) },
			key:         testChainKey,
			wantUnkeyed: true,
			wantEvents:  events,
		},
		{
			name: "an unkeyed log continued by a keyed writer verifies: the keyed part covers the prefix",
			write: func(t *testing.T, cfg FileConfig) {
				writeLog(t, cfg, 3)
				writeLog(t, cfg, 3, keyed...)
			},
			key:        testChainKey,
			wantEvents: events,
		},
		{
			name: "an edit in the unkeyed prefix of a keyed log is found even when the prefix is rechained",
			write: func(t *testing.T, cfg FileConfig) {
				writeLog(t, cfg, 3)
				writeLog(t, cfg, 3, keyed...)
			},
			tamper: func(t *testing.T, lines [][]byte) [][]byte {
				prefix := rechainPlain(t, append(lines[:1:1], lines[2:3]...))
				return append(prefix, lines[3:]...)
			},
			key:       testChainKey,
			wantBreak: "prev_hash does not match",
		},
		{
			name: "a keyed log continued by a writer without the key is reported unkeyed from there",
			write: func(t *testing.T, cfg FileConfig) {
				writeLog(t, cfg, 3, keyed...)
				writeLog(t, cfg, 3)
			},
			key:         testChainKey,
			wantUnkeyed: true,
			wantEvents:  events,
		},
		{
			name:  "a keyed log with an edited event fails under the key",
			write: func(t *testing.T, cfg FileConfig) { writeLog(t, cfg, events, keyed...) },
			tamper: func(t *testing.T, lines [][]byte) [][]byte {
				lines[2] = bytes.Replace(lines[2], []byte(`"allow":true`), []byte(`"allow":false`), 1)
				return lines
			},
			key:       testChainKey,
			wantBreak: "the line was edited",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.write(t, FileConfig{Dir: dir})
			if tt.tamper != nil {
				path := filepath.Join(dir, ActiveFile)
				writeLines(t, path, tt.tamper(t, readLines(t, path)))
			}
			report, err := VerifyWith(dir, VerifyOptions{ChainKey: tt.key})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.wantBreak != "" {
				require.NotNil(t, report.Break, "%s", report)
				assert.Contains(t, report.Break.Reason, tt.wantBreak)
				return
			}
			require.True(t, report.OK(), "%s", report)
			assert.Equal(t, tt.wantUnkeyed, report.Unkeyed != nil, "%s", report)
			assert.Equal(t, tt.wantEvents, report.Events)
		})
	}
}

func TestKeyedChainMarkerStartsEachWritersPart(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 2, WithChainKey(testChainKey))
	lines := readLines(t, filepath.Join(dir, ActiveFile))
	require.Len(t, lines, 3)
	assert.Equal(t, KindChain, lineKind(lines[0]))
	assert.Contains(t, string(lines[0]), `"chain":{"alg":"hmac-sha256","key_id":"`+ChainKeyID(testChainKey)+`"}`)
	assert.False(t, plainChain.matches(lines[1], mustStoredHash(t, lines[1])), "events are not plain SHA-256")
}

func TestWriterWithAShortChainKeyRefusesEvents(t *testing.T) {
	w := openWriter(t, FileConfig{Dir: t.TempDir()}, WithChainKey([]byte("short")))
	ev := testEvent(1)
	err := w.Record(&ev)
	require.ErrorIs(t, err, ErrUnhealthy)
	assert.Contains(t, err.Error(), "at least 32")
}

func mustStoredHash(t *testing.T, line []byte) string {
	t.Helper()
	h, err := storedHash(line)
	require.NoError(t, err)
	return h
}

// fakeClock delivers a checkpoint tick when the test sends one; the send returns once the
// writer has taken it, and the writer handles a tick before anything queued after it.
type fakeClock struct {
	now   time.Time
	ticks chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ticks: make(chan time.Time)}
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Every(time.Duration) (<-chan time.Time, func()) { return c.ticks, func() {} }

// tick makes the interval elapse once.
func (c *fakeClock) tick() { c.ticks <- c.now }

// published records the checkpoints the writer publishes. It is read after Close.
type published struct{ list []Checkpoint }

func (p *published) add(c Checkpoint) { p.list = append(p.list, c) }

func checkpointOpts(every int, clock Clock, pub *published) []Option {
	return []Option{
		WithCheckpoints(CheckpointConfig{Key: testSignKey, EveryEvents: every, Every: time.Hour, Published: pub.add}),
		WithClock(clock),
	}
}

func counts(cs []Checkpoint) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.Count)
	}
	return out
}

func TestWriterEmitsCheckpointsEveryNEventsAndOnClose(t *testing.T) {
	dir := t.TempDir()
	var pub published
	writeLog(t, FileConfig{Dir: dir}, 10, checkpointOpts(4, newFakeClock(), &pub)...)

	// Lines: the first event and its checkpoint (count 1), 4 events, checkpoint (count 6),
	// 4 events, checkpoint (count 11), 1 event, checkpoint on Close (count 13).
	assert.Equal(t, []uint64{1, 6, 11, 13}, counts(pub.list))
	lines := readLines(t, filepath.Join(dir, ActiveFile))
	require.Len(t, lines, 14)
	for _, i := range []int{1, 6, 11, 13} {
		assert.Equal(t, KindCheckpoint, lineKind(lines[i]), "line %d", i+1)
	}
	assert.Equal(t, pub.list[3].LastHash, mustStoredHash(t, lines[12]))

	report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
	assert.Equal(t, 10, report.Events)
	assert.Equal(t, 4, report.Checkpoints)

	t.Run("a restarted writer keeps counting from the start of the log", func(t *testing.T) {
		var again published
		writeLog(t, FileConfig{Dir: dir}, 1, checkpointOpts(4, newFakeClock(), &again)...)
		assert.Equal(t, []uint64{15}, counts(again.list), "its first event is signed at once")
		report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey})
		require.NoError(t, err)
		assert.True(t, report.Complete(), "%s", report)
	})
}

// TestANewLogIsSignedFromItsFirstEvent: a writer signs its first event at once, so a log
// verifies completely with the public key (audit verify --config exits 0) while the writer still
// runs, from the first event on. Before, it reported "no checkpoint in the log" (exit 4) until
// EveryEvents events or the Every interval came round, a minute with the defaults.
func TestANewLogIsSignedFromItsFirstEvent(t *testing.T) {
	dir := t.TempDir()
	var pub published
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever},
		append(checkpointOpts(1000, newFakeClock(), &pub), WithDelivery(DeliveryBlocking))...)
	ev := testEvent(0)
	require.NoError(t, w.Record(&ev)) // blocking: returns once the event's batch is written

	report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
	assert.Equal(t, 1, report.Events)
	assert.Equal(t, 1, report.Checkpoints)

	for i := 1; i < 5; i++ { // the next ones wait for EveryEvents, Every or Close as before
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	assert.Len(t, pub.list, 1, "one checkpoint for the first event only")
}

func TestWriterEmitsATimedCheckpointOnlyAfterNewEvents(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	var pub published
	w := openWriter(t, FileConfig{Dir: dir}, checkpointOpts(1000, clock, &pub)...)
	for i := range 3 {
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	// The first event was signed at once (count 1).
	clock.tick() // covers the other 2: they were accepted before the tick
	clock.tick() // nothing new: no checkpoint
	ev := testEvent(3)
	require.NoError(t, w.Record(&ev))
	clock.tick()
	require.NoError(t, w.Close(context.Background())) // nothing new since the last tick

	assert.Equal(t, []uint64{1, 4, 6}, counts(pub.list))
	assert.True(t, pub.list[0].Time.Equal(clock.now), "the checkpoint time comes from the clock")
	report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
	assert.Equal(t, 3, report.Checkpoints)
}

func TestCheckpointsDetectTampering(t *testing.T) {
	type setup struct {
		lines    [][]byte // audit.log as written: 10 events, checkpoints at lines 2, 7, 12 and 14
		external []Checkpoint
	}
	tests := []struct {
		name string
		// tamper returns the new lines of audit.log and the external checkpoints to check.
		tamper    func(t *testing.T, s setup) ([][]byte, []Checkpoint)
		publicKey ed25519.PublicKey
		// wantBreak is part of the break's reason; "" means the tampering is not detected.
		wantBreak string
	}{
		{
			name:      "an untouched log with its external checkpoint verifies",
			tamper:    func(_ *testing.T, s setup) ([][]byte, []Checkpoint) { return s.lines, s.external },
			publicKey: testPublicKey,
		},
		{
			name: "an altered checkpoint time, the chain recomputed, fails the signature",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				s.lines[6] = editCheckpoint(t, s.lines[6], func(c *Checkpoint) { c.Time = c.Time.Add(time.Hour) })
				return rechainPlain(t, s.lines), nil
			},
			publicKey: testPublicKey,
			wantBreak: "audit.log:7: checkpoint signature does not verify",
		},
		{
			name: "an event deleted and the next checkpoint's count and last_hash forged to match fails the signature",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				lines := rechainPlain(t, append(s.lines[:8:8], s.lines[9:]...))
				lines[10] = editCheckpoint(t, lines[10], func(c *Checkpoint) {
					c.Count, c.LastHash = 10, mustStoredHash(t, lines[9])
				})
				return rechainPlain(t, lines), nil
			},
			publicKey: testPublicKey,
			wantBreak: "audit.log:11: checkpoint signature does not verify",
		},
		{
			name: "a forged checkpoint is not detected without the public key",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				lines := rechainPlain(t, append(s.lines[:8:8], s.lines[9:]...))
				lines[10] = editCheckpoint(t, lines[10], func(c *Checkpoint) {
					c.Count, c.LastHash = 10, mustStoredHash(t, lines[9])
				})
				lines = rechainPlain(t, lines)
				lines[12] = editCheckpoint(t, lines[12], func(c *Checkpoint) {
					c.Count, c.LastHash = 12, mustStoredHash(t, lines[11])
				})
				return rechainPlain(t, lines), nil
			},
		},
		{
			name: "a checkpoint's signature replaced by one over other bytes fails",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				s.lines[6] = editCheckpoint(t, s.lines[6], func(c *Checkpoint) {
					c.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(testSignKey, []byte("other")))
				})
				return rechainPlain(t, s.lines), nil
			},
			publicKey: testPublicKey,
			wantBreak: "checkpoint signature does not verify",
		},
		{
			name: "a checkpoint re-signed with another key fails naming its key id",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				s.lines[6] = editCheckpoint(t, s.lines[6], func(c *Checkpoint) { signCheckpoint(c, otherSignKey) })
				return rechainPlain(t, s.lines), nil
			},
			publicKey: testPublicKey,
			wantBreak: "signed with key id " + PublicKeyID(otherSignKey.Public().(ed25519.PublicKey)),
		},
		{
			name: "an event deleted before a checkpoint and the chain recomputed fails at the checkpoint",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				return rechainPlain(t, append(s.lines[:8:8], s.lines[9:]...)), nil
			},
			publicKey: testPublicKey,
			wantBreak: "checkpoint counts 11 lines before it, the log has 10",
		},
		{
			name: "the tail cut after the last in-log checkpoint is found by the external checkpoint",
			tamper: func(_ *testing.T, s setup) ([][]byte, []Checkpoint) {
				return s.lines[:12], s.external
			},
			publicKey: testPublicKey,
			wantBreak: "the log ends after 12 lines, but external checkpoint 1",
		},
		{
			name: "the tail cut together with the last checkpoint, without an external copy, is not detected",
			tamper: func(_ *testing.T, s setup) ([][]byte, []Checkpoint) {
				return s.lines[:13], nil
			},
			publicKey: testPublicKey,
		},
		{
			name: "the tail cut together with every checkpoint, without an external copy, is not detected",
			tamper: func(_ *testing.T, s setup) ([][]byte, []Checkpoint) {
				return s.lines[:1], nil
			},
		},
		{
			name: "a replaced log of the same length is found by the external checkpoint",
			tamper: func(t *testing.T, s setup) ([][]byte, []Checkpoint) {
				fresh := t.TempDir()
				writeLog(t, FileConfig{Dir: fresh}, 14)
				return readLines(t, filepath.Join(fresh, ActiveFile)), s.external
			},
			wantBreak: "external checkpoint 1",
		},
		{
			name: "a forged external checkpoint fails its signature",
			tamper: func(_ *testing.T, s setup) ([][]byte, []Checkpoint) {
				c := s.external[0]
				c.Count = 100
				return s.lines, []Checkpoint{c}
			},
			publicKey: testPublicKey,
			wantBreak: "external checkpoint 1 (count 100): checkpoint signature does not verify",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var pub published
			writeLog(t, FileConfig{Dir: dir}, 10, checkpointOpts(4, newFakeClock(), &pub)...)
			path := filepath.Join(dir, ActiveFile)
			s := setup{lines: readLines(t, path), external: pub.list[len(pub.list)-1:]}
			lines, external := tt.tamper(t, s)
			writeLines(t, path, lines)

			report, err := VerifyWith(dir, VerifyOptions{PublicKey: tt.publicKey, External: external})
			require.NoError(t, err)
			if tt.wantBreak == "" {
				assert.True(t, report.OK(), "%s", report)
				return
			}
			require.NotNil(t, report.Break, "%s", report)
			assert.Contains(t, report.Break.String(), tt.wantBreak)
		})
	}
}

// editCheckpoint changes the fields of a checkpoint line without signing it again (unless edit
// does); its prev_hash and hash are for rechainPlain to fix.
func editCheckpoint(t *testing.T, line []byte, edit func(c *Checkpoint)) []byte {
	t.Helper()
	rec, err := parseRecord(line, KindCheckpoint)
	require.NoError(t, err)
	c := *rec.Checkpoint
	edit(&c)
	return appendCheckpointLine(nil, lineID(line), &c, "")
}

func TestQuerySkipsTheWritersOwnRecords(t *testing.T) {
	dir := t.TempDir()
	var pub published
	opts := append(checkpointOpts(2, newFakeClock(), &pub), WithChainKey(testChainKey))
	writeLog(t, FileConfig{Dir: dir}, 5, opts...)
	require.Len(t, readLines(t, filepath.Join(dir, ActiveFile)), 5+1+3, "5 events, a chain record, 3 checkpoints")

	tests := []struct {
		name   string
		filter Filter
		want   int
	}{
		{"every line that is a call, and nothing else", Filter{Limit: -1}, 5},
		{"a kind family does not reach the writer's records", Filter{Kind: "audit", Limit: -1}, 0},
		{"the checkpoint kind itself matches nothing", Filter{Kind: KindCheckpoint, Limit: -1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Query(context.Background(), dir, tt.filter)
			require.NoError(t, err)
			assert.Equal(t, tt.want, res.Matched)
			assert.Len(t, res.Events, tt.want)
			assert.Zero(t, res.Malformed)
			for _, ev := range res.Events {
				assert.False(t, isRecordKind(ev.Kind), ev.Kind)
			}
		})
	}
}

func TestRecordRefusesTheWritersRecordKinds(t *testing.T) {
	for _, kind := range []string{KindCheckpoint, KindChain, "audit.anything"} {
		t.Run(kind+" is refused", func(t *testing.T) {
			w := NewWriter(&stubSink{})
			t.Cleanup(func() { _ = w.Close(context.Background()) })
			ev := testEvent(1)
			ev.Kind = Kind(kind)
			err := w.Record(&ev)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "reserved")
		})
	}
}

func TestCheckpointsRoundTripThroughTheProcessLog(t *testing.T) {
	dir := t.TempDir()
	var pub published
	writeLog(t, FileConfig{Dir: dir}, 3, checkpointOpts(1000, newFakeClock(), &pub)...)
	require.Len(t, pub.list, 2, "after the first event, and on Close")

	var processLog bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&processLog, nil))
	log.Info("sandgate starting")
	log.Info("audit checkpoint", "checkpoint", pub.list[0])
	processLog.WriteString("a line that is not JSON\n")

	got, err := ParseCheckpoints(&processLog)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, pub.list[0].Signature, got[0].Signature)
	require.NoError(t, got[0].CheckSignature(testPublicKey), "what the process log holds still verifies")

	t.Run("the checkpoint line of the audit log itself is read too", func(t *testing.T) {
		lines := readLines(t, filepath.Join(dir, ActiveFile))
		got, err := ParseCheckpoints(bytes.NewReader(lines[len(lines)-1]))
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.NoError(t, got[0].CheckSignature(testPublicKey))
	})
	t.Run("input without a checkpoint is an error", func(t *testing.T) {
		_, err := ParseCheckpoints(strings.NewReader(`{"msg":"hello"}` + "\n"))
		assert.ErrorContains(t, err, "no checkpoint found")
	})
}

func TestGeneratedKeysSignAndVerify(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	paths, err := GenerateKeys(dir, false)
	require.NoError(t, err)
	for path, mode := range map[string]os.FileMode{paths[0]: 0o600, paths[1]: 0o644, paths[2]: 0o600} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, mode, fi.Mode().Perm(), path)
	}
	privPEM, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	// The credential store trims trailing newlines; the key must still parse.
	priv, err := ParseSigningKey(bytes.TrimRight(privPEM, "\n"))
	require.NoError(t, err)
	pubPEM, err := os.ReadFile(paths[1])
	require.NoError(t, err)
	pubKey, err := ParsePublicKey(pubPEM)
	require.NoError(t, err)
	c := Checkpoint{Chain: ChainSHA256, Count: 1, LastHash: strings.Repeat("a", 64), Time: time.Now()}
	signCheckpoint(&c, priv)
	assert.NoError(t, c.CheckSignature(pubKey))
	chainKey, err := ReadKeyFile(paths[2])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(chainKey), MinChainKeyLen)

	_, err = GenerateKeys(dir, false)
	assert.ErrorContains(t, err, "exists (pass --force", "existing keys are not replaced by accident")
}

func TestCheckpointCountsSpanRotatedFilesAndRestarts(t *testing.T) {
	dir := t.TempDir()
	cfg := FileConfig{Dir: dir, MaxSize: 2 << 10}
	var first, second, third published
	writeLog(t, cfg, 9, append(checkpointOpts(4, newFakeClock(), &first), WithMaxBatch(1))...)
	// A writer without checkpoints in between: its lines still count for the next one.
	writeLog(t, cfg, 3)
	writeLog(t, cfg, 5, append(checkpointOpts(4, newFakeClock(), &second), WithMaxBatch(1))...)
	require.Greater(t, len(listFiles(t, dir)), 3, "the log rotated")
	// Lines: 9 events and 3 checkpoints (after the first event, then every 4: 12), 3 plain
	// events (15), then the second writer's first event and its checkpoint, 4 events and a
	// checkpoint (22).
	assert.Equal(t, []uint64{1, 6, 11}, counts(first.list))
	assert.Equal(t, []uint64{16, 21}, counts(second.list))

	// A crash leaves no checkpoint at the end: the next start counts on from the last one.
	active := filepath.Join(dir, ActiveFile)
	lines := readLines(t, active)
	writeLines(t, active, lines[:len(lines)-1])
	writeLog(t, cfg, 1, checkpointOpts(4, newFakeClock(), &third)...)
	assert.Equal(t, []uint64{22}, counts(third.list))

	report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey, External: third.list})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
	assert.Equal(t, 9+3+5+1, report.Events)
	assert.Equal(t, 5, report.Checkpoints)
}
