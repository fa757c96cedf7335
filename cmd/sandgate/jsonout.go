package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/sandgate/sandgate/audit"
)

// The -o json answers of the commands CI runs (audit verify, serve --check-config; policy test
// writes OPA's own JSON report): one JSON object on stdout, whatever the verdict, and the exit
// code the text form has. The object carries the exit code too, so a script that keeps only the
// output still knows it.

// verifyJSON is audit verify's answer.
type verifyJSON struct {
	Dir string `json:"dir"`
	// OK: no break in the chain. Complete: also keyed where a key was given and checkpointed
	// where a public key was (exit code 0).
	OK          bool           `json:"ok"`
	Complete    bool           `json:"complete"`
	ExitCode    int            `json:"exit_code"`
	Files       int            `json:"files"`
	Events      int            `json:"events"`
	Checkpoints int            `json:"checkpoints"`
	Lines       int            `json:"lines"`
	Chain       string         `json:"chain,omitempty"`
	Break       *placeJSON     `json:"break"`
	Unkeyed     *placeJSON     `json:"unkeyed"`
	Warnings    []string       `json:"warnings"`
	Recoveries  []recoveryJSON `json:"recoveries"`
	Summary     string         `json:"summary"` // the text form's message
}

// recoveryJSON is a torn tail cut from the log at start: where its record is (log, line) and
// what was cut (audit.Recovery).
type recoveryJSON struct {
	Log  string `json:"log"`
	Line int    `json:"line"`
	audit.Recovery
}

// placeJSON is a place in the log and what is wrong there.
type placeJSON struct {
	File   string `json:"file,omitempty"`
	Line   int    `json:"line,omitempty"`
	Reason string `json:"reason"`
}

func place(b *audit.Break) *placeJSON {
	if b == nil {
		return nil
	}
	return &placeJSON{File: b.File, Line: b.Line, Reason: b.Reason}
}

// writeVerifyJSON writes r as JSON and returns the exit code the text form would, with no
// message: stdout holds the whole answer.
func writeVerifyJSON(w io.Writer, dir string, r *audit.VerifyReport) error {
	code := exitOK
	switch {
	case !r.OK():
		code = exitBroken
	case !r.Complete():
		code = exitUnprotected
	}
	out := verifyJSON{Dir: dir, OK: r.OK(), Complete: r.Complete(), ExitCode: code, Files: r.Files, Events: r.Events,
		Checkpoints: r.Checkpoints, Lines: r.Lines, Chain: r.Chain, Break: place(r.Break), Unkeyed: place(r.Unkeyed),
		Warnings: r.Warnings, Recoveries: []recoveryJSON{}, Summary: r.String()}
	if out.Warnings == nil {
		out.Warnings = []string{}
	}
	for _, rc := range r.Recoveries {
		out.Recoveries = append(out.Recoveries, recoveryJSON{Log: rc.Log, Line: rc.Line, Recovery: rc.Recovery})
	}
	if err := writeJSON(w, out); err != nil {
		return err
	}
	if code != exitOK {
		return exitError{code: code}
	}
	return nil
}

// checkConfigJSON is serve --check-config's answer.
type checkConfigJSON struct {
	Config   string `json:"config"`
	Valid    bool   `json:"valid"`
	Offline  bool   `json:"offline"`
	ExitCode int    `json:"exit_code"`
	// Error is what the text form prints: the field's path and what is wrong with it.
	Error string `json:"error,omitempty"`
}

// writeCheckJSON writes the verdict of checking path (err nil: valid) and returns the exit code
// the text form would, with no message.
func writeCheckJSON(w io.Writer, path string, offline bool, err error) error {
	out := checkConfigJSON{Config: path, Valid: err == nil, Offline: offline}
	if err != nil {
		out.ExitCode, out.Error = exitFailure, err.Error()
	}
	if werr := writeJSON(w, out); werr != nil {
		return werr
	}
	if err != nil {
		return exitError{code: exitFailure}
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the answer as JSON: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
