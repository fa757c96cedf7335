package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ: the unit of utime and stime in /proc/PID/stat. It is 100 on every
// Linux the bench runs on (the value is fixed by the kernel ABI).
const clockTicks = 100

// ProcSample is what /proc says about one process at one moment.
type ProcSample struct {
	CPU     time.Duration // user + system
	RSS     int64         // bytes
	PeakRSS int64         // bytes (VmHWM)
	Threads int
	Files   int // open file descriptors
}

// sampleProc reads /proc/PID/stat, /proc/PID/status and /proc/PID/fd.
func sampleProc(pid int) (ProcSample, error) {
	var s ProcSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// The command name may contain spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, fmt.Errorf("parse stat of %d: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return s, fmt.Errorf("parse stat of %d: %d fields", pid, len(f))
	}
	// After ')': state(0) ... utime is field 14 of stat, index 11 here; stime index 12.
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	st2, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status of %d: %w", pid, err)
	}
	defer st2.Close()
	sc := bufio.NewScanner(st2)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			s.RSS = n << 10
		case "VmHWM":
			s.PeakRSS = n << 10
		case "Threads":
			s.Threads = int(n)
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.Files = len(ents)
	}
	return s, nil
}

// sampleGroup sums sampleProc over every process of process group pgid (a peer that forks
// workers or helpers is measured whole). Peak RSS is the sum of the members' peaks.
func sampleGroup(pgid int) (ProcSample, error) {
	var sum ProcSample
	found := false
	for _, pid := range groupPIDs(pgid) {
		s, err := sampleProc(pid)
		if err != nil {
			continue
		}
		found = true
		sum.CPU += s.CPU
		sum.RSS += s.RSS
		sum.PeakRSS += s.PeakRSS
		sum.Threads += s.Threads
		sum.Files += s.Files
	}
	if !found {
		return sum, fmt.Errorf("no process in group %d", pgid)
	}
	return sum, nil
}

// resetGroupPeakRSS resets the peak RSS of every process of group pgid.
func resetGroupPeakRSS(pgid int) {
	for _, pid := range groupPIDs(pgid) {
		resetPeakRSS(pid)
	}
}

// groupPIDs lists the processes of group pgid (field 5 of /proc/PID/stat).
func groupPIDs(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); len(f) >= 3 && f[2] == strconv.Itoa(pgid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// resetPeakRSS clears VmHWM so the next sample's peak covers only what follows (Linux ≥ 4.0:
// writing 5 to clear_refs). Failure is ignored: the peak then covers the process lifetime.
func resetPeakRSS(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
