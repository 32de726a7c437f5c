package frontend

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"gcompile/ir"
)

// Result-file protocol between the model driver and the loader. The
// loader passes -out FILE; the driver writes FILE whole (through a rename,
// so a driver killed mid-write leaves no half result) as a status line,
// DriverOK or DriverError, followed by the module text, the parameter list
// or the error. The module does not travel on stdout because model code
// may print there; a missing FILE tells the loader that the driver never
// got to the end of Model() (os.Exit, a crash, a kill).
const (
	DriverOK    = "ok\n"
	DriverError = "error\n"
	// DriverFailPrefix starts the one line the driver writes to stderr
	// when it cannot write its result file, so the loader can tell that
	// apart from the model's own exit.
	DriverFailPrefix = "gcompile model driver: "
)

// Main is the model driver's entry point: it records fn with the settings
// from the command line and writes the module (or, with -describe, the
// model parameters as JSON). With -out FILE it writes the result file
// described at DriverOK; without it, it prints the module to stdout and
// DSL errors to stderr with exit status 2, for running a driver by hand.
func Main(fn ModelFunc) {
	fs := flag.NewFlagSet("driver", flag.ExitOnError)
	name := fs.String("name", "model", "module name")
	batch := fs.Int("batch", 8, "global batch")
	float := fs.String("float", "f32", "param dtype")
	eval := fs.Bool("eval", false, "build the module evaluation runs")
	classes := fs.Int("classes", 0, "token ids the data holds when the vocabulary is padded past them (0: not padded)")
	genStep := fs.Int("gen-step", 0, "build one step of generation of this many tokens per sequence (0: the training module)")
	genContext := fs.Int("gen-context", 0, "with -gen-step: the positions each key/value cache holds")
	genEveryRow := fs.Bool("gen-every-row", false, "with -gen-step: output the logits of every token of the step, not only each sequence's last")
	set := fs.String("set", "", "model parameters k=v,…")
	describe := fs.Bool("describe", false, "list model parameters as JSON")
	out := fs.String("out", "", "write the result file the loader reads here instead of printing the module")
	fs.Parse(os.Args[1:])
	cfg := Config{Name: *name, Batch: *batch, Eval: *eval, Classes: *classes}
	if *genStep > 0 {
		cfg.Generate = &Generation{Step: *genStep, Context: *genContext, EveryRow: *genEveryRow}
	}
	if *out == "" {
		if err := driverMain(os.Stdout, fn, cfg, *float, *set, *describe); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return
	}
	var payload bytes.Buffer
	err := driverMain(&payload, fn, cfg, *float, *set, *describe)
	result := DriverOK + payload.String()
	if err != nil {
		result = DriverError + err.Error()
	}
	if werr := writeResult(*out, result); werr != nil {
		fmt.Fprintf(os.Stderr, "%s%v\n", DriverFailPrefix, werr)
		os.Exit(1)
	}
	if err != nil {
		os.Exit(2)
	}
}

// writeResult writes the result file through a temporary name and a
// rename, so the loader sees either the whole result or none.
func writeResult(path, result string) error {
	tmp := path + ".part"
	if err := os.WriteFile(tmp, []byte(result), 0o600); err != nil {
		return fmt.Errorf("writing the result: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing the result: %w", err)
	}
	return nil
}

func driverMain(w io.Writer, fn ModelFunc, cfg Config, float, set string, describe bool) error {
	kv, err := ParseSet(set)
	if err != nil {
		return err
	}
	dt, err := ir.ParseDType(float)
	if err != nil {
		return err
	}
	cfg.Set, cfg.Float = kv, dt
	if describe {
		docs, err := Describe(fn, cfg)
		if err != nil {
			return err
		}
		return json.NewEncoder(w).Encode(docs)
	}
	m, err := Build(fn, cfg)
	if err != nil {
		return err
	}
	return ir.Fprint(w, m)
}

// ParseSet reads "layers=8,hidden=256" into a map.
func ParseSet(s string) (map[string]string, error) {
	kv := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return kv, nil
	}
	for _, f := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || k == "" || v == "" {
			if strings.TrimSpace(f) == "" {
				return nil, fmt.Errorf("--set %q: an empty pair (a comma too many); want key=value pairs separated by commas", s)
			}
			return nil, fmt.Errorf("--set %q: %q is not key=value; want key=value pairs separated by commas", s, f)
		}
		if _, dup := kv[k]; dup {
			return nil, fmt.Errorf("--set: %s given twice", k)
		}
		kv[k] = v
	}
	return kv, nil
}

// FormatSet is the inverse of ParseSet (keys sorted).
func FormatSet(kv map[string]string) string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + kv[k]
	}
	return strings.Join(parts, ",")
}
