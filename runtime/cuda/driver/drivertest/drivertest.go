// Package drivertest opens the machine's real GPU for the tests and
// benchmarks that need one, so each binding's GPU tests share one way to
// get a device, a current context and a stream, and one way to skip.
package drivertest

import (
	"os"
	"runtime"
	"testing"

	"gcompile/runtime/cuda/driver"
)

// Env must be "1" for GPU tests to run; without it they skip, since a
// machine without a GPU cannot run them.
const Env = "GCOMPILE_GPU_TESTS"

// GPU is device 0 with its primary context retained and a stream.
type GPU struct {
	Driver *driver.Driver
	Device driver.Device
	Props  driver.DeviceProps
	Ctx    driver.Context
	Stream driver.Stream
}

// Open skips tb unless Env is "1", naming what the test would check;
// otherwise it opens device 0 and makes its context current on the
// calling goroutine, which it locks to its OS thread for the rest of tb
// (a CUDA context is current per thread). Everything is released when tb
// ends.
func Open(tb testing.TB, what string) *GPU {
	tb.Helper()
	if os.Getenv(Env) != "1" {
		tb.Skipf("set %s=1 on a machine with an NVIDIA GPU to %s", Env, what)
	}
	runtime.LockOSThread()
	tb.Cleanup(runtime.UnlockOSThread)
	d, err := driver.Load()
	must(tb, err)
	must(tb, d.Init())
	g := &GPU{Driver: d}
	g.Device, err = d.Device(0)
	must(tb, err)
	g.Props, err = d.Props(g.Device)
	must(tb, err)
	g.Ctx, err = d.PrimaryCtxRetain(g.Device)
	must(tb, err)
	tb.Cleanup(func() { d.PrimaryCtxRelease(g.Device) })
	must(tb, d.SetCurrent(g.Ctx))
	g.Stream, err = d.StreamCreate(driver.StreamNonBlocking)
	must(tb, err)
	tb.Cleanup(func() { d.StreamDestroy(g.Stream) })
	return g
}

// Enter makes the context current for a sub-test or sub-benchmark, which
// runs on a goroutine of its own, and locks that goroutine to its thread
// until tb ends.
func (g *GPU) Enter(tb testing.TB) {
	tb.Helper()
	runtime.LockOSThread()
	tb.Cleanup(runtime.UnlockOSThread)
	must(tb, g.Driver.SetCurrent(g.Ctx))
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
