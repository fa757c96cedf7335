package audit

// Sink stores sealed events. The Writer is its only caller and calls it from one goroutine, so a
// Sink need not be safe for concurrent use by several writers.
//
// Adding a sink (Redis Stream, OTel logs) means implementing these three methods with the same
// guarantees; the chain, the encoding and the delivery contract stay in the Writer.
type Sink interface {
	// LastHash returns the Hash of the newest event already stored, or "" when the sink is empty,
	// so that the chain continues across restarts. The Writer calls it once, before any write.
	LastHash() (string, error)
	// WriteBatch appends the batch's events in order. It is all or nothing: on error none of the
	// batch may remain stored, because the Writer retries the same batch and a partial write would
	// store events twice. A sink that cannot undo a partial write must fail every later call.
	WriteBatch(b *Batch) error
	// Close flushes (fsync for a file) and releases the sink.
	Close() error
}

// Batch is a run of consecutive sealed lines. It and everything it refers to are valid only
// during the WriteBatch call: the Writer reuses the memory for the next batch.
type Batch struct {
	// Events are the batch's call events with ID, Time, PrevHash and Hash filled in.
	Events []Event
	// Lines are the lines to store, in order, each one JSON object without a trailing newline: the
	// call events in their final encoding and, between them, the writer's own records (KindChain,
	// KindCheckpoint), which have no entry in Events. A sink that stores text must store these
	// bytes unchanged, since the hash covers them.
	Lines [][]byte
}
