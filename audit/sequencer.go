package audit

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// sequencer is the state of the writer's one goroutine: the head of the chain, the line count
// for checkpoints, and buffers reused from batch to batch.
type sequencer struct {
	w     *Writer
	chain *chainHash
	prev  string // hash of the last line
	// lines counts the lines of the log, from its start (kept only with checkpoints).
	lines uint64
	// sinceCheckpoint counts call events written since the last checkpoint.
	sinceCheckpoint int
	// marked is set once a keyed writer has started its part of the log with a KindChain record.
	marked bool
	// signed is set once this writer wrote a checkpoint. Until then each event is followed by
	// one, so the first event a writer writes is signed at once: a new log verifies with the
	// public key from its first event on, instead of reporting "no checkpoint" until EveryEvents
	// or Every come round, and a restart after a crash signs the tail the crash left unsigned.
	signed bool

	events    []Event
	lastBatch int         // events in the last batch: a blocking writer lingers after a crowded one
	linger    *time.Timer // stopped between batches
	out       [][]byte
	ends      []int
	buf       []byte
	published []Checkpoint
}

// newSequencer reads where the sink's chain ends and checks the keys.
func (w *Writer) newSequencer() (*sequencer, error) {
	s := &sequencer{
		w:      w,
		chain:  &chainHash{alg: ChainSHA256},
		events: make([]Event, 0, w.maxBatch),
		out:    make([][]byte, 0, w.maxBatch+2),
		ends:   make([]int, 0, w.maxBatch+2),
	}
	if w.chainKey != nil {
		if err := checkChainKey(w.chainKey); err != nil {
			return nil, err
		}
		s.chain = newKeyedChain(w.chainKey)
	}
	var err error
	if s.prev, err = w.sink.LastHash(); err != nil {
		return nil, fmt.Errorf("read the last hash to continue the chain: %w", err)
	}
	if c := w.checkpoints; c != nil {
		if len(c.Key) != ed25519.PrivateKeySize {
			return nil, errors.New("checkpoints: no Ed25519 signing key")
		}
		counter, ok := w.sink.(LineCounter)
		if !ok {
			return nil, fmt.Errorf("checkpoints: the sink (%T) cannot count its lines", w.sink)
		}
		if s.lines, err = counter.CountLines(); err != nil {
			return nil, fmt.Errorf("checkpoints: count the lines of the log: %w", err)
		}
	}
	return s, nil
}

// sequence is the writer's only goroutine: it drains the queue in batches, chains and encodes
// them, adds the writer's own records (chain marker, checkpoints), and writes each batch until it
// succeeds or Close gives up.
func (w *Writer) sequence(s *sequencer) {
	defer close(w.done)
	var tick, replenish <-chan time.Time
	if w.checkpoints != nil {
		var stop func()
		tick, stop = w.clock.Every(w.checkpoints.Every)
		defer stop()
	}
	if w.reserve > 0 { // while the disk is full, notice when space is freed
		t := time.NewTicker(w.retryMax)
		defer t.Stop()
		replenish = t.C
	}
	if r, ok := w.sink.(Recoverer); ok && r.Recovered() != nil && !s.recordRecovery(r.Recovered()) {
		return
	}
	for {
		select {
		case <-replenish:
			if w.short.Load() {
				w.checkReserve()
			}
		case ev, ok := <-w.queue:
			if !ok {
				s.closing()
				return
			}
			if ok, open := s.batch(ev); !ok {
				return
			} else if !open {
				s.closing()
				return
			}
		case <-tick:
			// Whatever was accepted before the tick goes first, so the checkpoint covers it.
			for drained := false; !drained; {
				select {
				case ev, ok := <-w.queue:
					if !ok {
						s.closing()
						return
					}
					if ok, open := s.batch(ev); !ok {
						return
					} else if !open {
						s.closing()
						return
					}
				default:
					drained = true
				}
			}
			if s.sinceCheckpoint > 0 && !s.checkpointOnly() {
				return
			}
		}
	}
}

// closing writes the last checkpoint when events were written since the one before.
func (s *sequencer) closing() {
	if s.w.checkpoints != nil && s.sinceCheckpoint > 0 {
		s.checkpointOnly()
	}
}

// batch writes first and whatever else is queued or arrives within the linger, up to maxBatch
// events. ok is false when the writer must stop (Close gave up, or a line could not be sealed);
// open is false when the queue was found closed.
func (s *sequencer) batch(first Event) (ok, open bool) {
	w := s.w
	s.events = append(s.events[:0], first)
	open = s.collect()
	s.lastBatch = len(s.events)

	s.buf, s.ends = s.buf[:0], s.ends[:0]
	if !s.mark() {
		s.lose()
		return false, open
	}
	every := 0
	if w.checkpoints != nil {
		every = w.checkpoints.EveryEvents
	}
	for i := range s.events {
		e := &s.events[i]
		e.Time = e.Time.UTC()
		e.PrevHash, e.Hash = s.prev, ""
		start := len(s.buf)
		s.buf = appendEvent(s.buf, e)
		if !s.seal(start) {
			s.lose()
			return false, open
		}
		e.Hash = s.prev
		s.sinceCheckpoint++
		if every > 0 && (s.sinceCheckpoint >= every || !s.signed) && !s.appendCheckpoint() {
			s.lose()
			return false, open
		}
	}
	if !s.flush(s.events) {
		return false, open
	}
	clear(s.events) // drop references to label maps until the next batch
	return true, open
}

// lose counts the batch's events as lost (a line could not be sealed) and tells their Records.
func (s *sequencer) lose() {
	s.w.lost.Add(uint64(len(s.events)))
	acknowledge(s.events, fmt.Errorf("%w: %w", ErrNotDelivered, s.w.Healthy()))
}

// collect adds to the batch what is queued, then what arrives within the linger, up to maxBatch
// events; false when the queue was found closed.
func (s *sequencer) collect() bool {
	w := s.w
	linger := s.lingerFor()
	var timeout <-chan time.Time // the linger, started when the queue is first found empty
	yielded := !w.blocking
	for len(s.events) < w.maxBatch {
		var ev Event
		var more bool
		select {
		case ev, more = <-w.queue:
		default:
			if !yielded {
				// Group commit: the calls running now get to queue their events before this
				// batch is written, instead of each waiting on a write of its own. With nothing
				// else runnable Gosched returns at once.
				yielded = true
				runtime.Gosched()
				continue
			}
			if linger <= 0 || w.blocking && len(s.events) >= blockingLingerEvents {
				return true
			}
			if timeout == nil {
				timeout = s.startLinger(linger)
				defer s.linger.Stop()
			}
			select {
			case ev, more = <-w.queue:
			case <-timeout:
				return true
			}
		}
		if !more {
			return false
		}
		s.events = append(s.events, ev)
	}
	return true
}

// blockingLinger is how long a blocking writer gathers a batch while its calls come in
// together (the last batch held more than one event): long enough to turn a write per event or
// two into one per dozens under load (BenchmarkRecordDelivery: half the CPU per event), short
// next to what it saves. A lone call never waits for it. Before it, collect yields once (group
// commit): interleaved A/B against not yielding, `sandbench -reps 5 -workloads
// route,intercept,mcp -concurrency 64` on a quiet 2-core machine, CPU per request 0.99× route,
// 0.94× intercept, 0.98× mcp (spread 0.81–1.07), fixed-rate p50 unchanged.
//
// 300 µs against 100 µs (2026-12-03, the same command with -reps 8, three runs, one of them
// with the places swapped, 24 repetitions pooled): CPU per request route 0.963×, intercept
// 0.999×, mcp 0.944× (medians; crossover estimates 0.955×, 1.009×, 0.939×), p50 unchanged at
// c=64 (10–19 ms) and at a fixed 500/s, req/s unchanged. A Record running the writer itself
// instead of handing its event over (leader/follower, branch exp/audit-leader-commit) measured
// worse: a write of one event per call.
const blockingLinger = 300 * time.Microsecond

// blockingLingerEvents ends a blocking writer's linger early: a batch this large already shares
// its write (a write of 730-byte lines costs 1.9 µs per line alone, 0.6 µs in twenties), and its
// callers have waited for it. Without it, calls that do little but record (BenchmarkRecordDelivery:
// 128 in flight) each waited out the whole linger: 6.3 µs per event at 100 µs, 13.5 at 300 µs.
const blockingLingerEvents = 16

// lingerFor is the linger of the next batch.
func (s *sequencer) lingerFor() time.Duration {
	if s.w.blocking {
		if s.lastBatch > 1 {
			return blockingLinger
		}
		return 0
	}
	return s.w.linger
}

// startLinger starts the batch's linger timer (one per sequencer, reused).
func (s *sequencer) startLinger(d time.Duration) <-chan time.Time {
	if s.linger == nil {
		s.linger = time.NewTimer(d)
	} else {
		s.linger.Reset(d)
	}
	return s.linger.C
}

// recordRecovery starts the writer's part of the log with the record of the torn tail the sink
// cut (recover.go), after the chain marker of a keyed writer and followed by a checkpoint when
// checkpoints are written, so that the record is keyed and signed at once.
func (s *sequencer) recordRecovery(r *Recovery) bool {
	s.buf, s.ends = s.buf[:0], s.ends[:0]
	if !s.mark() {
		return false
	}
	start, now := len(s.buf), s.w.clock.Now()
	s.buf = appendRecoveredLine(s.buf, newID(now), now, r, s.prev)
	if !s.seal(start) {
		return false
	}
	if s.w.checkpoints != nil && !s.appendCheckpoint() {
		return false
	}
	return s.flush(nil)
}

// mark appends the chain marker a keyed writer starts its part of the log with, once.
func (s *sequencer) mark() bool {
	if s.chain.mac == nil || s.marked {
		return true
	}
	start, now := len(s.buf), s.w.clock.Now()
	s.buf = appendChainLine(s.buf, newID(now), now, s.chain, s.prev)
	if !s.seal(start) {
		return false
	}
	s.marked = true
	return true
}

// checkpointOnly writes a batch holding just a checkpoint.
func (s *sequencer) checkpointOnly() bool {
	s.buf, s.ends = s.buf[:0], s.ends[:0]
	if !s.appendCheckpoint() {
		return false
	}
	return s.flush(nil)
}

// seal fills in the hash of the line that starts at start in buf and moves the chain on. On
// failure the writer stops for good rather than write a chain with a hole in it.
func (s *sequencer) seal(start int) bool {
	var (
		h   string
		err error
	)
	if s.buf, h, err = s.chain.seal(s.buf, start); err != nil {
		s.w.setFailure(fmt.Errorf("%w: encode line: %w", ErrUnhealthy, err))
		return false
	}
	s.prev = h
	s.lines++
	s.ends = append(s.ends, len(s.buf))
	return true
}

// appendCheckpoint signs the chain's current head and appends the checkpoint line.
func (s *sequencer) appendCheckpoint() bool {
	now := s.w.clock.Now().UTC()
	c := Checkpoint{Chain: s.chain.alg, Count: s.lines, LastHash: s.prev, Time: now}
	signCheckpoint(&c, s.w.checkpoints.Key)
	start := len(s.buf)
	s.buf = appendCheckpointLine(s.buf, newID(now), &c, s.prev)
	if !s.seal(start) {
		return false
	}
	s.sinceCheckpoint, s.signed = 0, true
	s.published = append(s.published, c)
	return true
}

// flush cuts buf into lines and writes them with the batch's call events, then publishes the
// checkpoints among them.
func (s *sequencer) flush(events []Event) bool {
	s.out = s.out[:0]
	start := 0
	for _, end := range s.ends {
		s.out = append(s.out, s.buf[start:end:end])
		start = end
	}
	b := Batch{Events: events, Lines: s.out}
	if !s.w.write(&b) {
		return false
	}
	if pub := s.w.checkpoints; pub != nil && pub.Published != nil {
		for _, c := range s.published {
			pub.Published(c)
		}
	}
	s.published = s.published[:0]
	return true
}
