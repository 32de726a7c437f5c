package ir_test

import (
	"errors"
	"os"
	"regexp"
	"testing"

	"gcompile/ir"
)

// FuzzParse feeds arbitrary text to the parser. Properties:
//   - Parse never panics, and its errors are *ir.ParseError;
//   - whatever Parse accepts prints to text that parses again, and printing
//     that is a fixed point: print(parse(print(m))) == print(m);
//   - Verify never panics on anything Parse returns, and says the same
//     about the module and its reprint.
//
// Crashers are kept under testdata/fuzz/FuzzParse and rerun by go test.
func FuzzParse(f *testing.F) {
	if golden, err := os.ReadFile(goldenGPT); err == nil {
		f.Add(string(golden))
	} else {
		f.Fatalf("seed: %v", err)
	}
	for _, c := range edgeCases {
		f.Add(c.text)
		if c.canonical != "" {
			f.Add(c.canonical)
		}
	}
	for _, c := range parseErrorCases {
		f.Add(c.text)
	}
	for _, c := range verifyCases {
		f.Add(c.text)
	}
	f.Fuzz(func(t *testing.T, text string) {
		m, err := ir.Parse("fuzz.gir", text)
		if err != nil {
			var pe *ir.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse error is %T, want *ir.ParseError: %v", err, err)
			}
			return
		}
		verr := ir.Verify(m, "fuzz")
		printed := ir.Print(m)
		m2, err := ir.Parse("printed.gir", printed)
		if err != nil {
			t.Fatalf("printed module does not parse: %v\ninput:\n%q\nprinted:\n%s", err, text, printed)
		}
		if again := ir.Print(m2); again != printed {
			t.Fatalf("print(parse(print(m))) != print(m)\ninput:\n%q\nprinted:\n%q\nreprinted:\n%q", text, printed, again)
		}
		verr2 := ir.Verify(m2, "fuzz")
		// The two name their own files' lines; the rest must agree.
		if readLine.ReplaceAllString(errText(verr), "") != readLine.ReplaceAllString(errText(verr2), "") {
			t.Fatalf("Verify disagrees on the module and its reprint\ninput:\n%q\nfirst: %v\nreprint: %v", text, verr, verr2)
		}
	})
}

// readLine is the .gir line a diagnostic names (Value.Read).
var readLine = regexp.MustCompile(` \((fuzz|printed)\.gir:\d+\)`)

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
