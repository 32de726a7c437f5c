package cpu

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// HostMemory reads MemAvailable and lowers it to the room under a cgroup
// limit, not counting reclaimable page cache as used.
func TestHostMemoryReadsLinuxFigures(t *testing.T) {
	const meminfo = "MemTotal:       24683584 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n"
	tests := []struct {
		name    string
		meminfo string // "" : no file
		cgroup  []string
		want    int64
		from    string
		ok      bool
	}{
		{"meminfo", meminfo, nil, 2 << 20, "MemAvailable in", true},
		{"no meminfo", "", nil, 0, "", false},
		{"malformed", "MemAvailable: lots\n", nil, 0, "", false},
		{"no MemAvailable line", "MemTotal: 4 kB\n", nil, 0, "", false},
		{"cgroup without a limit", meminfo, []string{"max\n", "4096\n", ""}, 2 << 20, "MemAvailable in", true},
		{"cgroup limit above MemAvailable", meminfo, []string{"1073741824\n", "4096\n", ""}, 2 << 20, "MemAvailable in", true},
		{"cgroup limit below MemAvailable", meminfo, []string{"1048576\n", "524288\n", "anon 1\ninactive_file 0\n"}, 512 << 10, "cgroup memory limit", true},
		{"page cache does not count as used", meminfo, []string{"1048576\n", "1048576\n", "anon 1\ninactive_file 262144\n"}, 256 << 10, "cgroup memory limit", true},
		{"usage past the limit", meminfo, []string{"1048576\n", "2097152\n", ""}, 0, "cgroup memory limit", true},
		{"cgroup alone", "", []string{"1048576\n", "0\n", ""}, 1 << 20, "cgroup memory limit", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, text string) string {
				p := filepath.Join(dir, name)
				if text != "" {
					require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
				}
				return p
			}
			oldInfo, oldGroups, oldLimit := procMeminfo, cgroups, asLimit
			t.Cleanup(func() { procMeminfo, cgroups, asLimit = oldInfo, oldGroups, oldLimit })
			asLimit = func() (int64, bool) { return 0, false }
			procMeminfo = write("meminfo", tt.meminfo)
			cgroups = []cgroupFiles{{filepath.Join(dir, "none.max"), filepath.Join(dir, "none.current"), "", ""}}
			if tt.cgroup != nil {
				cgroups = []cgroupFiles{{write("memory.max", tt.cgroup[0]), write("memory.current", tt.cgroup[1]), write("memory.stat", tt.cgroup[2]), "inactive_file"}}
			}
			n, from, ok := HostMemory()
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, n)
			assert.Contains(t, from, tt.from)
		})
	}
}

// Under an address-space limit (ulimit -v, prlimit --as) the room is
// what the limit leaves beside the process's own size: the arena is
// refused with that cause, where the Go runtime died allocating it ("fatal
// error: out of memory" and every goroutine's stack).
func TestHostMemoryHonoursTheAddressSpaceLimit(t *testing.T) {
	dir := t.TempDir()
	oldInfo, oldStatus, oldGroups, oldLimit := procMeminfo, procStatus, cgroups, asLimit
	t.Cleanup(func() { procMeminfo, procStatus, cgroups, asLimit = oldInfo, oldStatus, oldGroups, oldLimit })
	procMeminfo = filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(procMeminfo, []byte("MemAvailable:   8388608 kB\n"), 0o644)) // 8 GiB
	procStatus = filepath.Join(dir, "status")
	require.NoError(t, os.WriteFile(procStatus, []byte("Name:\tgcompile\nVmSize:\t 1048576 kB\nVmRSS:\t 1024 kB\n"), 0o644)) // 1 GiB
	cgroups = nil
	for _, tt := range []struct {
		name  string
		limit int64
		set   bool
		want  int64
		from  string
	}{
		{"no limit", 0, false, 8 << 30, "MemAvailable"},
		{"limit above", 16 << 30, true, 8 << 30, "MemAvailable"},
		{"limit below", 4 << 30, true, 3 << 30, "ulimit -v"},
		{"limit under the process's size", 512 << 20, true, 0, "ulimit -v"},
	} {
		asLimit = func() (int64, bool) { return tt.limit, tt.set }
		n, from, ok := HostMemory()
		assert.True(t, ok, tt.name)
		assert.Equal(t, tt.want, n, tt.name)
		assert.Contains(t, from, tt.from, tt.name)
	}
	got, ok := virtualSize(procStatus)
	if assert.True(t, ok) {
		assert.Equal(t, int64(1<<30), got)
	}
}

// Asynchronous data parallelism loads its replicas and the update program
// in one process too: their arenas are checked together before any is
// allocated.
func TestAsyncChecksMemoryBeforeLoading(t *testing.T) {
	m, err := ir.Parse("m.gir", "gir 1\nmodule \"m\"\n"+
		`%0 = state : f32[1024,1024] {name="x"} @model.go:7`+"\n"+
		`%1 = neg %0 : f32[1024,1024] @model.go:8`+"\n"+
		"update %0 = %1\n")
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	fake := func(n int64) MemorySource { return func() (int64, string, bool) { return n, "fake", true } }
	tests := []struct {
		name  string
		avail int64
		want  string
	}{
		{"replicas and server do not fit together", 20 << 20, "out of device memory: the 3 arenas need 24.00 MiB together but this machine has 20.00 MiB available (fake)"},
		{"one replica alone would", 9 << 20, "the 3 arenas need 24.00 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newAsyncJob(p, p, nil, 0, &runtime.Job{Layout: runtime.SingleProcess(2)}, Options{HostMemory: fake(tt.avail)})
			require.Error(t, err)
			assert.ErrorIs(t, err, lower.ErrDoesNotFit)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	// With room, the check passes and loading goes on to the async job's
	// own checks (this toy has no params to exchange).
	_, err = newAsyncJob(p, p, nil, 0, &runtime.Job{Layout: runtime.SingleProcess(2)}, Options{HostMemory: fake(25 << 20)})
	if err != nil {
		assert.NotErrorIs(t, err, lower.ErrDoesNotFit)
	}
}
