// Package audit writes, checks and reads the audit log: exactly one Event per call, denied calls
// included, hash-chained so that an edited, removed or reordered event is detected.
//
// # Writing
//
// A Writer takes events from request goroutines (Record) and hands them through a bounded queue to
// one sequencer goroutine, which stamps the chain (PrevHash, Hash), encodes each event as one JSON
// line and appends whole batches to a Sink (FileSink today; Redis Stream and OTel logs later).
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
// The canonical form of an event is the exact bytes of its log line (without the newline) with the
// value of the "hash" member emptied, that is with the line's fixed suffix
//
//	,"hash":"<64 hex digits>"}
//
// replaced by
//
//	,"hash":""}
//
// Hash is the lowercase hex SHA-256 of those bytes, and PrevHash is the Hash of the event before it
// ("" for the first event of a log). The writer produces the line with encoding/json (members in
// Event's field order, no insignificant whitespace, map keys sorted, HTML characters not escaped,
// Time in UTC as RFC 3339 with nanoseconds), and "prev_hash" then "hash" are always the last two
// members. Because the hash covers the bytes as written rather than a re-encoding, Verify reads
// only those two members and needs no knowledge of the other fields: a log written by an older or
// newer version verifies the same way, and any byte changed outside the hash value is detected.
//
// A chain without a secret detects accidental damage and naive edits. Someone who can rewrite the
// files can also recompute every hash after their edit; catching that needs the head hash kept
// elsewhere (the Redis Stream sink, or an exported checkpoint). A tail cut off at a line boundary
// of the newest file leaves a valid chain and is not detected either.
//
// # Reading
//
// Verify walks the rotated files oldest to newest, then audit.log, and reports the first break with
// its file and line. Query streams the same files through a Filter and keeps the newest matches.
package audit
