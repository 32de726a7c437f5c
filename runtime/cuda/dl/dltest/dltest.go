// Package dltest compiles small C stand-ins for the NVIDIA libraries so that
// the runtime/cuda bindings can be tested on machines without a GPU.
//
// A stand-in implements the real C signatures, records what it received and
// returns scripted statuses; compiled with the system C compiler into a
// shared object, it is loaded through the same purego path as the real
// library. That checks what matters for bindings written without headers:
// argument order and widths, pointers and structs passed by value, outputs
// written back, and every failure status turned into a Go error.
package dltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireGCCEnv names the variable that, set to 1, turns a missing C
// compiler from a skip into a failure (CI sets it, so the tests cannot pass
// by not running).
const RequireGCCEnv = "GCOMPILE_REQUIRE_GCC"

// compiler returns the C compiler to use: $CC if set, else gcc.
func compiler() string {
	if cc := os.Getenv("CC"); cc != "" {
		return cc
	}
	return "gcc"
}

// Build compiles the C file src into a shared object named lib (for example
// "libcuda.so.1") in a fresh temporary folder and returns its path. Extra
// arguments go to the compiler, e.g. "-DNO_ALLTOALL". Without a compiler the
// test is skipped, or fails when GCOMPILE_REQUIRE_GCC=1.
func Build(t testing.TB, src, lib string, args ...string) string {
	t.Helper()
	cc, err := exec.LookPath(compiler())
	if err != nil {
		if os.Getenv(RequireGCCEnv) == "1" {
			t.Fatalf("C compiler %q not found (%v) and %s=1", compiler(), err, RequireGCCEnv)
		}
		t.Skipf("C compiler %q not found (%v); set %s=1 to make this a failure", compiler(), err, RequireGCCEnv)
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		t.Fatalf("dltest: %v", err)
	}
	out := filepath.Join(t.TempDir(), lib)
	cmdArgs := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-o", out, abs}, args...)
	cmd := exec.Command(cc, cmdArgs...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dltest: %s %v: %v\n%s", cc, cmdArgs, err, msg)
	}
	return out
}
