package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// CheckFiles checks the files and folders the config names, which Load leaves alone (audit
// query and netpol load configs written for a pod on machines that do not have its files):
// the audit folder is a folder or can be created (it is not a file, nor under one), and, unless
// offline, the volume holding it has room for the audit reserve, each credential file can be read, the proxy CA files exist, the policy folder is a
// folder, the kubeconfig can be read and each stdio upstream's command is an executable.
// Offline is for a rendered config checked outside its pod: the files only the pod has are
// skipped. Every error names the field. Reading the credentials' values, parsing the CA and
// compiling the policies are left to the packages that own them (serve --check-config).
func (c *Config) CheckFiles(offline bool) error {
	var errs fieldErrors
	checkCreatableDir(&errs, "audit.file.dir", c.Audit.File.Dir)
	if offline {
		return errs.err()
	}
	checkReserveFits(&errs, c.Audit.File.Dir, c.Audit.File.ReserveMB)
	for i, cr := range c.Credentials {
		if cr.File != "" {
			checkReadableFile(&errs, fmt.Sprintf("credentials[%d].file", i), cr.File)
		}
	}
	if c.Proxy.CA.Cert != "" && c.Proxy.CA.Key != "" {
		checkReadableFile(&errs, "proxy.ca.cert", c.Proxy.CA.Cert)
		checkReadableFile(&errs, "proxy.ca.key", c.Proxy.CA.Key)
	}
	c.Policy.checkFiles(&errs)
	c.Redis.TLS.checkFiles("redis.tls", &errs)
	c.Audit.OTLP.TLS.checkFiles("audit.otlp.tls", &errs)
	if c.Kubernetes.Kubeconfig != "" {
		checkReadableFile(&errs, "kubernetes.kubeconfig", c.Kubernetes.Kubeconfig)
	}
	for i, u := range c.Gateway.Upstreams {
		if u.Command == "" {
			continue
		}
		var pe *fs.PathError
		var ee *exec.Error
		_, err := exec.LookPath(u.Command)
		switch {
		case errors.As(err, &pe): // a path: "/x: no such file or directory", "/x: permission denied"
			errs.add(fmt.Sprintf("gateway.upstreams[%d].command", i), "%v", pathError(err))
		case errors.As(err, &ee): // a name: "executable file not found in $PATH"
			errs.add(fmt.Sprintf("gateway.upstreams[%d].command", i), "%q: %v", u.Command, ee.Err)
		case err != nil:
			errs.add(fmt.Sprintf("gateway.upstreams[%d].command", i), "%v", err)
		}
	}
	return errs.err()
}

// checkCreatableDir accepts an existing folder, or a path whose nearest existing ancestor is a
// folder (serve creates the rest).
func checkCreatableDir(errs *fieldErrors, field, dir string) {
	for p := dir; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		switch {
		case err == nil && st.IsDir():
			return
		case err == nil && p == dir:
			errs.add(field, "%s is a file, not a folder", dir)
			return
		case err == nil:
			errs.add(field, "cannot create %s: %s is a file", dir, p)
			return
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			errs.add(field, "%v", pathError(err))
			return
		case filepath.Dir(p) == p:
			return
		}
	}
}

func checkReadableFile(errs *fieldErrors, field, path string) {
	f, err := os.Open(path)
	if err != nil {
		errs.add(field, "%v", pathError(err))
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		errs.add(field, "%s is a folder, not a file", path)
	}
}

// pathError drops the operation from an *fs.PathError ("open /x: no such file or directory"
// reads "/x: no such file or directory"): the field already says what the path is for.
func pathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}

func (p *Policy) checkFiles(errs *fieldErrors) {
	if b := p.Bundle; b.Configured() {
		checkReadableFile(errs, "policy.bundle.public_key_file", b.PublicKeyFile)
		if b.File != "" {
			checkReadableFile(errs, "policy.bundle.file", b.File)
		}
	} else {
		checkPolicyDir(errs, "policy.dir", p.Dir)
	}
	if p.Shadow.Dir != "" {
		checkPolicyDir(errs, "policy.shadow.dir", p.Shadow.Dir)
	}
}

func checkPolicyDir(errs *fieldErrors, field, dir string) {
	if st, err := os.Stat(dir); err != nil {
		errs.add(field, "%v", pathError(err))
	} else if !st.IsDir() {
		errs.add(field, "%s is a file, not a folder of .rego files", dir)
	}
}
