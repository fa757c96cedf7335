package audit

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Delivery says when Record returns, after Kubernetes audit's backend modes.
type Delivery string

const (
	// DeliveryAsync returns once the event is queued: the call's answer does not wait for the
	// file, and a process killed before the next batch is written loses the events of the calls
	// it answered in that window (a few milliseconds at most: the linger and one write).
	DeliveryAsync Delivery = "async"
	// DeliveryBlocking returns once the event is written to the sink (write(2) done; fsynced
	// too with FsyncAlways), so the caller can hold the answer's last bytes until then: killing
	// the process loses no answered call's event. Events are written in groups (group commit):
	// whatever is queued while one batch is written goes in the next; a lone call is written at
	// once, and only while calls come in together does the writer linger (blockingLinger).
	DeliveryBlocking Delivery = "blocking"
)

// ParseDelivery reads the config file's audit.delivery.
func ParseDelivery(s string) (Delivery, error) {
	switch d := Delivery(s); d {
	case DeliveryAsync, DeliveryBlocking:
		return d, nil
	case "":
		return DeliveryBlocking, nil
	}
	return "", fmt.Errorf("audit.delivery: %q is not one of blocking, async", s)
}

// ErrNotDelivered wraps why a blocking Record could not confirm the event's write: the writer
// closed or gave up, or the sink failed for longer than the delivery timeout. The event may still
// be written later; the caller must not complete the call's answer.
var ErrNotDelivered = errors.New("audit event not confirmed written")

// WithDelivery sets the delivery mode (default DeliveryAsync; serve's default, audit.delivery,
// is blocking). A blocking writer does not take WithLinger's linger: see DeliveryBlocking.
func WithDelivery(d Delivery) Option {
	return func(w *Writer) { w.blocking = d == DeliveryBlocking }
}

// WithDeliveryTimeout bounds how long a blocking Record waits for its event's write while the
// sink fails (default 10s); then it returns ErrNotDelivered and the caller cuts the answer.
func WithDeliveryTimeout(d time.Duration) Option {
	return func(w *Writer) {
		if d > 0 {
			w.deliveryTimeout = d
		}
	}
}

// Blocking reports a writer whose Record waits for the write (DeliveryBlocking).
func (w *Writer) Blocking() bool { return w.blocking }

// Acks are the channels on which the sequencer tells a blocking Record its event's fate: nil
// once written, an error when it will not be. Each is used once per Record and reused unless
// the Record stopped waiting (the writer was stuck), in which case a late answer lands in its
// buffer and the channel is dropped.
var acks = sync.Pool{New: func() any { return make(chan error, 1) }}

// awaitWrite waits for the answer on ack, or until the writer has been stuck on one write for
// the delivery timeout (watchStuck): a timer per call cost a blocking Record half its CPU.
func (w *Writer) awaitWrite(ack chan error) error {
	select {
	case err := <-ack:
		acks.Put(ack)
		return err
	case <-*w.stuck.Load():
		w.undelivered.Add(1)
		cause := w.Healthy()
		if cause == nil {
			cause = errors.New("the sink is slow")
		}
		return fmt.Errorf("%w within %s: %w", ErrNotDelivered, w.deliveryTimeout, cause)
	}
}

// watchStuck is a blocking writer's watchdog: when one batch has been in the sink (failing and
// retried, or hanging) for longer than the delivery timeout, it wakes every Record waiting for
// its write (awaitWrite), which then cuts its answer; the Records after that wait afresh.
func (w *Writer) watchStuck() {
	t := time.NewTicker(max(w.deliveryTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case now := <-t.C:
			since := w.writingSince.Load()
			if since != 0 && now.UnixNano()-since > int64(w.deliveryTimeout) {
				fresh := make(chan struct{})
				close(*w.stuck.Swap(&fresh))
			}
		}
	}
}

// acknowledge tells each blocking Record of events its fate (nil: written).
func acknowledge(events []Event, err error) {
	for i := range events {
		if a := events[i].ack; a != nil {
			a <- err
			events[i].ack = nil
		}
	}
}
