// Command testreport reads `go test -json` on stdin and prints what a
// person needs from it: one line per package, the whole output of every
// test that failed, and every skipped test with the reason it gave (plain
// `go test` hides skips). It exits 1 when anything failed, so
// `go test -json ./... | testreport` can stand in for `go test ./...`.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// event is one line of test2json output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	failed, err := report(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// report writes the summary of the events in r to w and says whether a
// test or package failed.
func report(r io.Reader, w io.Writer) (failed bool, err error) {
	outputs := map[string][]string{} // package + test → its lines so far
	var skips []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not an event (a build error printed by the go command).
			fmt.Fprintln(w, string(line))
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output", "build-output":
			outputs[key] = append(outputs[key], e.Output)
		case "skip":
			if e.Test != "" {
				skips = append(skips, fmt.Sprintf("SKIP %s %s: %s", e.Package, e.Test, reason(outputs[key])))
			} else {
				fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
			}
			delete(outputs, key)
		case "pass":
			if e.Test == "" {
				fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
			delete(outputs, key)
		case "fail", "build-fail":
			failed = true
			if e.Test == "" {
				// Tests still running when their binary died (a timeout's
				// panic, a crash) never get an action of their own: their
				// output, the panic's included, is shown with the package.
				for _, k := range slices.Sorted(maps.Keys(outputs)) {
					if pkg, test, _ := strings.Cut(k, " "); pkg == e.Package && test != "" {
						fmt.Fprintf(w, "--- did not finish: %s\n%s", test, strings.Join(outputs[k], ""))
						delete(outputs, k)
					}
				}
			}
			fmt.Fprint(w, strings.Join(outputs[key], ""))
			if e.Test == "" {
				fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
			delete(outputs, key)
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	for _, s := range skips {
		fmt.Fprintln(w, s)
	}
	return failed, nil
}

// reason is what a skipped test printed before its "--- SKIP" line: the
// argument of t.Skip, as file:line: text.
func reason(lines []string) string {
	var out []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		return "no reason given"
	}
	return strings.Join(out, " ")
}
