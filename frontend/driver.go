package frontend

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"gcompile/ir"
)

// Main is the model driver's entry point: it records fn with the settings
// from the command line and prints the module (or, with -describe, the
// model parameters as JSON). DSL errors go to stderr, exit status 2.
func Main(fn ModelFunc) {
	fs := flag.NewFlagSet("driver", flag.ExitOnError)
	name := fs.String("name", "model", "module name")
	batch := fs.Int("batch", 8, "global batch")
	float := fs.String("float", "f32", "param dtype")
	set := fs.String("set", "", "model parameters k=v,…")
	describe := fs.Bool("describe", false, "list model parameters as JSON")
	fs.Parse(os.Args[1:])
	if err := driverMain(os.Stdout, fn, *name, *batch, *float, *set, *describe); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

func driverMain(w io.Writer, fn ModelFunc, name string, batch int, float, set string, describe bool) error {
	kv, err := ParseSet(set)
	if err != nil {
		return err
	}
	dt, err := ir.ParseDType(float)
	if err != nil {
		return err
	}
	cfg := Config{Name: name, Batch: batch, Set: kv, Float: dt}
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
			return nil, fmt.Errorf("--set %q: want key=value pairs separated by commas", f)
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
