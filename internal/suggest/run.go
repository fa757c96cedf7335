package suggest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandgate/sandgate/policy"
)

// Options select what Suggest reads.
type Options struct {
	// Template is the sandbox template whose calls are read and whose data is changed.
	Template string
	// Since skips calls before it (zero: all).
	Since time.Time
	// PolicyDir is the serving policy folder: its data file holds templates[Template], and a
	// copy of it with the change is what the suggestion is checked against.
	PolicyDir string
}

// maxDistinct bounds the distinct calls kept to check the suggestion against; past it, calls
// are still counted as evidence but not evaluated again.
const maxDistinct = 100_000

// Suggest reads src and works out the change for opts.Template, checked against a copy of the
// policy folder with the change (in a temporary folder, removed before it returns).
func Suggest(ctx context.Context, opts Options, src Source) (*Suggestion, error) {
	d, err := readData(opts.PolicyDir, opts.Template)
	if err != nil {
		return nil, err
	}
	a := newAnalysis(opts.Template, d.tmpl, d.providers)
	allowed, denied := map[string]*Observation{}, map[string]*Observation{}
	err = src(ctx, func(o *Observation) error {
		if templateOf(o.Input) != opts.Template || (!opts.Since.IsZero() && o.Time.Before(opts.Since)) {
			return nil
		}
		a.observe(o)
		keep := allowed
		if !o.Allowed {
			keep = denied
		}
		if k := inputKey(o.Input); keep[k] == nil && len(keep) < maxDistinct {
			keep[k] = o
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s := a.finish()
	if err := s.check(ctx, d, opts.PolicyDir, allowed, denied); err != nil {
		return nil, err
	}
	return s, nil
}

// check applies the change in a copy of the folder and decides the template's calls again:
// each denied call the change is meant to lift must be allowed (else it is listed as not lifted),
// and no allowed call may become denied (else the removals are withheld). Then it writes the
// tests and runs them.
func (s *Suggestion) check(ctx context.Context, d *dataFile, dir string, allowed, denied map[string]*Observation) error {
	tmp, err := os.MkdirTemp("", "sandgate-suggest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	eng, err := s.candidate(ctx, d, dir, tmp)
	if err != nil {
		return err
	}
	if len(s.Remove) > 0 {
		if broken := stillAllowed(ctx, eng, allowed); broken != nil {
			s.Withheld = fmt.Sprintf("without them, the change would deny %s that was allowed (e.g. %s); left for you to look at",
				broken.Kind, broken.ID)
			s.Remove = nil
			if eng, err = s.candidate(ctx, d, dir, tmp); err != nil {
				return err
			}
		}
	}
	s.notLifted(ctx, eng, denied)
	s.Tests = s.testFile(ctx, eng)
	if err := os.WriteFile(filepath.Join(tmp, s.TestFile), []byte(s.Tests), 0o644); err != nil {
		return err
	}
	sum, err := policy.RunTests(ctx, io.Discard, false, tmp)
	if err != nil {
		return fmt.Errorf("run the suggested tests: %w", err)
	}
	if !sum.OK() {
		if before, err := policy.RunTests(ctx, io.Discard, false, dir); err == nil && !before.OK() {
			return fmt.Errorf("the policy folder's own tests fail already, without the change: fix them first (sandgate policy test %s)", dir)
		}
		return fmt.Errorf("the policy folder with the change fails %d of its tests (%s among them): run `sandgate policy test` on the folder --out writes to see which",
			sum.Failed+sum.Errored, s.TestFile)
	}
	return nil
}

// candidate writes the folder with the change into tmp and loads it.
func (s *Suggestion) candidate(ctx context.Context, d *dataFile, dir, tmp string) (*policy.Engine, error) {
	if err := d.parse(s.Template); err != nil { // a fresh tree: apply edits it
		return nil, err
	}
	d.apply(s.Add, s.Remove)
	edited, err := d.render()
	if err != nil {
		return nil, err
	}
	s.DataFile, s.Data, s.Diff = d.name, string(edited), d.unifiedDiff(edited, dir)
	s.TestFile = "suggest_" + ident(s.Template) + "_test.rego"
	if err := copyFolder(dir, tmp, map[string][]byte{d.name: edited}); err != nil {
		return nil, err
	}
	eng, err := policy.New(ctx, tmp, policy.WithDecisionCache(0))
	if err != nil {
		return nil, fmt.Errorf("the policy folder with the change does not load: %w", err)
	}
	return eng, nil
}

// stillAllowed is an allowed call the candidate denies, or nil.
func stillAllowed(ctx context.Context, eng *policy.Engine, allowed map[string]*Observation) *Observation {
	for _, o := range allowed {
		if !eng.DecideDocument(ctx, o.Input).Allow {
			return o
		}
	}
	return nil
}

// notLifted lists the denials the change was meant to lift and does not.
func (s *Suggestion) notLifted(ctx context.Context, eng *policy.Engine, denied map[string]*Observation) {
	meant := map[string]bool{}
	for _, e := range s.Add {
		for _, c := range e.Evidence.Codes {
			meant[c] = true
		}
	}
	a := &analysis{unlifted: map[string]*Unlifted{}}
	for _, o := range denied {
		if !meant[o.Code] {
			continue
		}
		if d := eng.DecideDocument(ctx, o.Input); !d.Allow {
			a.cannot(o, factsOf(o.Input), fmt.Sprintf("still denied with the change (%s): %s", d.Code, d.Reason))
		}
	}
	for _, u := range a.unlifted {
		s.Unlifted = append(s.Unlifted, u)
	}
}

// Write writes the policy folder dir with the change into out (a new or empty folder): every
// file of dir, the data file edited, and the test file.
func (s *Suggestion) Write(dir, out string) error {
	if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty: name a new folder for the suggested policies (nothing is overwritten)", out)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return copyFolder(dir, out, map[string][]byte{s.DataFile: []byte(s.Data), s.TestFile: []byte(s.Tests)})
}

// copyFolder copies the policy folder src to dst (the files the engine and the tests read, in
// subfolders too; hidden ones left out), with the files of replace put in place of (or beside)
// the originals.
func copyFolder(src, dst string, replace map[string][]byte) error {
	err := filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if rel != "." && strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if _, ok := replace[rel]; ok || !e.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		return fmt.Errorf("copy the policy folder %s: %w", src, err)
	}
	for name, b := range replace {
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
