package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// checkReserveFits refuses an audit reserve (audit.file.reserve_mb) the volume holding dir
// cannot give: larger than the whole volume, or than its free space (plus a reserve file already
// allocated there). serve would then start with its reserve short, stay not ready and refuse
// every call until space is freed.
func checkReserveFits(errs *fieldErrors, dir string, reserveMB int) {
	if reserveMB <= 0 {
		return
	}
	p := dir
	for {
		if _, err := os.Stat(p); err == nil || !errors.Is(err, fs.ErrNotExist) || filepath.Dir(p) == p {
			break
		}
		p = filepath.Dir(p)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(p, &st); err != nil {
		return // the folder check says what is wrong with the path
	}
	const mib = 1 << 20
	reserve := int64(reserveMB) * mib
	total := int64(st.Blocks) * st.Bsize
	free := int64(st.Bavail) * st.Bsize
	if fi, err := os.Stat(filepath.Join(dir, "audit.reserve")); err == nil {
		free += fi.Size() // allocated by an earlier start: it is the reserve's already
	}
	switch {
	case reserve >= total:
		errs.add("audit.file.reserve_mb", "%d MiB is more than the whole volume holding %s (%d MiB): "+
			"serve would never become ready; set it well below the volume's size", reserveMB, dir, total/mib)
	case reserve > free:
		errs.add("audit.file.reserve_mb", "%d MiB is more than the %d MiB free on the volume holding %s: "+
			"serve would refuse every call until space is freed", reserveMB, free/mib, dir)
	}
}
