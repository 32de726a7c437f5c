package cpu_test

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// fakeMemory is a machine with n bytes available.
func fakeMemory(n int64) cpu.MemorySource {
	return func() (int64, string, bool) { return n, "fake", true }
}

// stateProgram lowers a module holding one 4 MiB state and its 4 MiB
// negation, the state's next value, on a mesh of dp devices (none when dp
// is 0): an 8 MiB arena per device.
func stateProgram(t *testing.T, dp int) *lower.Program {
	t.Helper()
	mesh, place := "", ""
	if dp > 0 {
		mesh, place = fmt.Sprintf("mesh dp=%d\n", dp), " place=[R]"
	}
	text := "gir 1\nmodule \"m\"\n" + mesh +
		`%0 = state : f32[1024,1024] {name="x"` + place + `} @model.go:7` + "\n" +
		`%1 = neg %0 : f32[1024,1024] {` + place + `} @model.go:8` + "\n" +
		"update %0 = %1\n"
	m, err := ir.Parse("m.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	require.Equal(t, int64(8<<20), p.ArenaBytes)
	return p
}

// Before allocating, the backend compares the arenas it is about to
// allocate, all together, with what the machine can give, and refuses with
// the figures and the largest buffers instead of dying out of memory.
func TestLoadRefusesArenasLargerThanTheMachine(t *testing.T) {
	single, mesh := stateProgram(t, 0), stateProgram(t, 4)
	load := func(p *lower.Program, opts cpu.Options) error { _, err := cpu.Load(p, opts); return err }
	cluster := func(p *lower.Program, opts cpu.Options) error { _, err := cpu.NewCluster(p, opts); return err }
	pipeline := func(p *lower.Program, opts cpu.Options) error {
		_, err := cpu.NewPipelineCluster([]*lower.Program{p}, opts)
		return err
	}
	tests := []struct {
		name string
		load func(*lower.Program, cpu.Options) error
		prog *lower.Program
		opts cpu.Options
		want []string // "" : it loads
	}{
		{"one device fits", load, single, cpu.Options{HostMemory: fakeMemory(9 << 20)}, nil},
		{"one device does not", load, single, cpu.Options{HostMemory: fakeMemory(1 << 20)}, []string{
			"out of device memory: device 0's arena needs 8.00 MiB but this machine has 1.00 MiB available (fake)",
			"device 0: arena 8.00 MiB\n  largest buffers:\n    %0 state f32[1024,1024] 4.00 MiB (optimizer_state, layer -1) @model.go:7\n    %1 neg f32[1024,1024] 4.00 MiB",
		}},
		{"unknown memory is not checked", load, single, cpu.Options{HostMemory: func() (int64, string, bool) { return 0, "", false }}, nil},
		{"the device cap still applies", load, single, cpu.Options{MemoryCap: 1 << 20, HostMemory: fakeMemory(1 << 30)}, []string{
			"device 0: out of device memory: program \"m\" needs an arena of 8388608 bytes, more than the device cap of 1048576 bytes",
		}},
		{"four devices fit together", cluster, mesh, cpu.Options{HostMemory: fakeMemory(33 << 20)}, nil},
		{"four devices fit one by one but not together", cluster, mesh, cpu.Options{HostMemory: fakeMemory(20 << 20)}, []string{
			"the 4 arenas need 32.00 MiB together but this machine has 20.00 MiB available (fake)",
			"device 0: arena 8.00 MiB\n  largest buffers:\n    %0 state",
		}},
		{"pipeline cluster", pipeline, mesh, cpu.Options{HostMemory: fakeMemory(20 << 20)}, []string{"the 4 arenas need 32.00 MiB together"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.load(tt.prog, tt.opts)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, lower.ErrDoesNotFit), "%v", err)
			for _, w := range tt.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

// A plan built from sizes that fit in an int64 but in no machine (a 4 TiB
// param from --set) compiles, and loading it on this machine, with its
// real memory figures, is an error, not a crash. Past what Go can
// allocate it is refused whatever the machine says.
func TestHugePlanIsRefusedBeforeAllocating(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the machine's memory is read from /proc/meminfo")
	}
	if _, _, ok := cpu.HostMemory(); !ok {
		t.Skip("this machine does not say how much memory it has")
	}
	model := func(side int) frontend.ModelFunc {
		return func(b *frontend.Builder) {
			w := b.Param("w", []int{side, side}, frontend.Zeros, frontend.NoParallel)
			b.Loss(w.Sum())
		}
	}
	tests := []struct {
		name string
		side int
		opts cpu.Options
		want string
	}{
		{"4 TiB on this machine", 1 << 20, cpu.Options{}, "but this machine has"},
		{"1 PiB anywhere", 1 << 24, cpu.Options{HostMemory: fakeMemory(1 << 60)}, "more than the cpu backend can allocate (128.00 TiB)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := compile(t, model(tt.side))
			assert.Greater(t, p.ArenaBytes, int64(tt.side)*int64(tt.side)*4, "the param, its gradient and the loss")
			var err error
			require.NotPanics(t, func() { _, err = cpu.NewCluster(p, tt.opts) })
			require.Error(t, err)
			assert.True(t, errors.Is(err, lower.ErrDoesNotFit), "%v", err)
			assert.ErrorContains(t, err, tt.want)
			assert.ErrorContains(t, err, "param f32[")
		})
	}
}

// A plan whose buffers reach past its arena (corrupted, or from a
// planner bug) is refused at load instead of corrupting memory.
func TestPlanWithBufferOutsideItsArenaIsRefused(t *testing.T) {
	p := stateProgram(t, 0)
	bad := *p
	bad.ArenaBytes = 6 << 20
	_, err := cpu.Load(&bad, cpu.Options{HostMemory: fakeMemory(1 << 30)})
	require.Error(t, err)
	assert.ErrorContains(t, err, `device 0: program "m": %1 neg f32[1024,1024] 4.00 MiB (workspace, layer -1) @model.go:8 at offset 4194304 lies outside its arena of 6291456 bytes`)
}
