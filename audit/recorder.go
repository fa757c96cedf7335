package audit

// Recorder is what the request path needs of the audit log: record exactly one event per call,
// and say whether it can (callers refuse new calls while Healthy returns an error).
type Recorder interface {
	Record(ev *Event) error
	Healthy() error
}
