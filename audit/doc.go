// Package audit writes, checks and reads the audit log: exactly one Event per call, denied calls
// included, hash-chained (keyed, with signed checkpoints, when configured) so that an edited,
// removed, reordered or cut-off event is detected.
//
// # Writing
//
// A Writer takes events from request goroutines (Record) and hands them through a bounded queue to
// one sequencer goroutine, which stamps the chain (PrevHash, Hash), encodes each event as one JSON
// line, adds its own records (the chain marker, checkpoints) and appends whole batches to a Sink
// (FileSink; the StreamMirror copies the file to a Redis Stream).
//
// The delivery contract: an event accepted by Record (Record returned nil) is written to the sink
// exactly once and in acceptance order, or the writer becomes unhealthy. While unhealthy, Record
// refuses every new event with an error so that callers deny the call (fail closed); the writer
// retries the failed batch with backoff and turns healthy again when the sink accepts it. A full
// queue blocks Record for a bounded time and then returns ErrQueueFull: events are never dropped
// silently. Close stops intake, writes everything queued and closes the sink; if the sink still
// fails when Close's context ends, Close reports how many accepted events were not written. What
// the contract cannot cover: a process crash loses the queued events and, depending on the fsync
// mode, the unsynced tail of the file.
//
// # Hash chain and canonical form
//
// Every line of the log is chained: call events and the writer's own records (KindChain,
// KindCheckpoint) alike. The canonical form of a line is its exact bytes (without the newline)
// with the value of the "hash" member emptied, that is with the line's fixed suffix
//
//	,"hash":"<64 hex digits>"}
//
// replaced by
//
//	,"hash":""}
//
// Hash is the lowercase hex SHA-256 of those bytes, or, in a keyed chain, the lowercase hex
// HMAC-SHA-256 of them under the chain key; PrevHash is the Hash of the line before it ("" for
// the first line of a log). The writer produces an event's line with encoding/json's rules
// (members in Event's field order, no insignificant whitespace, map keys sorted, HTML characters
// not escaped, Time in UTC as RFC 3339 with nanoseconds), and "prev_hash" then "hash" are always
// the last two members. Because the hash covers the bytes as written rather than a re-encoding,
// Verify reads only those two members (and the kind of the writer's records) and needs no
// knowledge of the other fields: a log written by an older or newer version verifies the same
// way, and any byte changed outside the hash value is detected.
//
// Which algorithm a line uses is told by the log itself: lines are plain SHA-256 until a
// KindChain record,
//
//	{"id":"…","time":"…","kind":"audit.chain","chain":{"alg":"hmac-sha256","key_id":"<16 hex>"},"prev_hash":"…","hash":"…"}
//
// hashed under the key it names by ChainKeyID; from there on lines are keyed. A keyed writer
// writes one before its first line after every start, so logs written before keying (and every
// old log) keep verifying as plain SHA-256, and the keyed part that follows covers them through
// its prev_hash. A plain line where the chain is keyed means a writer without the key, or a
// rewrite by someone without it: Verify with the key reports a log whose newest lines are plain
// (VerifyReport.Unkeyed) rather than passing it, so a keyed log cannot be downgraded silently;
// Verify without the key refuses a keyed log (ErrChainKeyNeeded).
//
// A Checkpoint line (see its documentation for the format) signs, with Ed25519, the number of
// lines before it and the hash of the last of them. It is chained like any line, so Verify checks
// its count and last hash against the chain and, with the public key, its signature; a copy kept
// outside the log (CheckpointConfig.Published, the process log) lets Verify find a log that was
// cut off or replaced after that checkpoint.
//
// What each mode detects (docs/audit.md has the full table): a plain chain detects accidental
// damage and naive edits, not an edit whose author recomputed the chain after it. A keyed chain
// detects every edit, removal and reordering by someone without the key. Signed checkpoints keep
// the log up to the last checkpoint safe even from a holder of the chain key. Nothing inside the
// log detects a tail cut off at a line boundary, checkpoints included: only a checkpoint kept
// elsewhere does.
//
// # Reading
//
// Verify walks the rotated files oldest to newest, then audit.log, and reports the first break with
// its file and line. Query streams the same files through a Filter and keeps the newest matches;
// it skips the writer's own records, which are not calls.
package audit
