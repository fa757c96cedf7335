package audit

// Recorder is what the request path needs of the audit log: record exactly one event per call,
// and say whether it can (callers refuse new calls while Healthy returns an error).
type Recorder interface {
	Record(ev *Event) error
	Healthy() error
}

// ReservingRecorder is a Recorder that can set room aside for a call's event before the call is
// answered (Writer; see reserve.go): the request path takes a slot when a call begins, refuses
// the call without one, and records the event on it.
type ReservingRecorder interface {
	Recorder
	Reserve() (Slot, error)
	RecordReserved(ev *Event, s Slot) error
}
