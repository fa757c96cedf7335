package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ReserveFile is the file in the audit dir that holds the FileSink's reserve: preallocated
// space, drawn on (truncated) when the disk is full and restored (fallocate) once space is
// freed. It is not part of the log.
const ReserveFile = "audit.reserve"

// reserveBlock is the granularity of draws: a file system allocates whole blocks.
const reserveBlock = 4096

var _ Reserver = (*FileSink)(nil)

// openReserve opens Dir/audit.reserve and allocates it whole. A disk too full for that is not
// an error: the sink starts with its reserve short, and the writer refuses calls until
// Replenish succeeds.
func (s *FileSink) openReserve() error {
	if s.cfg.Reserve == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(s.cfg.Dir, ReserveFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open the audit reserve: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open the audit reserve: %w", err)
	}
	s.reserve, s.reserveSize = f, fi.Size()
	if err := s.replenishLocked(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		s.closeReserve()
		return err
	}
	return nil
}

func (s *FileSink) closeReserve() {
	if s.reserve != nil {
		s.reserve.Close()
		s.reserve = nil
	}
}

// ReserveBytes is the size of the reserve when whole.
func (s *FileSink) ReserveBytes() int64 { return s.cfg.Reserve }

// Replenish allocates the reserve whole again after a draw, or reports why it cannot (the disk
// is still full).
func (s *FileSink) Replenish() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replenishLocked()
}

func (s *FileSink) replenishLocked() error {
	if s.reserve == nil || s.reserveSize >= s.cfg.Reserve {
		return nil
	}
	if err := syscall.Fallocate(int(s.reserve.Fd()), 0, 0, s.cfg.Reserve); err != nil {
		return fmt.Errorf("allocate the %d-byte audit reserve in %s (%d bytes left of it): %w",
			s.cfg.Reserve, s.cfg.Dir, s.reserveSize, err)
	}
	s.reserveSize = s.cfg.Reserve
	return nil
}

// draw frees the blocks that need bytes take from the reserve, so that the write that failed
// on a full disk fits; false when the reserve cannot give them.
func (s *FileSink) draw(need int64) bool {
	if s.reserve == nil {
		return false
	}
	take := (need + reserveBlock - 1) / reserveBlock * reserveBlock
	if take > s.reserveSize {
		return false
	}
	if err := s.reserve.Truncate(s.reserveSize - take); err != nil {
		return false
	}
	s.reserveSize -= take
	return true
}

// ReserveBytes passes the file sink's reserve through (see Reserver).
func (s *notifyingSink) ReserveBytes() int64 {
	if r, ok := s.Sink.(Reserver); ok {
		return r.ReserveBytes()
	}
	return 0
}

// Replenish passes through to the file sink (see Reserver).
func (s *notifyingSink) Replenish() error {
	if r, ok := s.Sink.(Reserver); ok {
		return r.Replenish()
	}
	return nil
}
