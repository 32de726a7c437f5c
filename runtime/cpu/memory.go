package cpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gcompile/ir"
	"gcompile/lower"
)

// Every device's arena is one Go allocation of the machine's memory, and
// a plan larger than that memory does not fail cleanly: the allocation
// may succeed (Linux overcommits untouched pages) and the process is
// killed when the pages are first written, or Go throws "out of memory",
// which no recover catches. So the arenas a cluster is about to allocate
// are compared, all together, with what the machine can give before any
// of them is allocated.

// A MemorySource says how many bytes of memory this process can still
// allocate and where that figure comes from, for the error message; ok is
// false when it cannot tell, and then only the per-device cap is checked.
type MemorySource func() (available int64, from string, ok bool)

// maxArenaAlloc is the largest arena the backend allocates even when the
// machine's memory is unknown: Go's allocator throws, unrecoverably, on
// requests past its address space (2^48 bytes on amd64 and arm64).
const maxArenaAlloc = 1 << 47

// arenaNeed is what loading p allocates: its device and host arenas,
// each rounded up to the uint64 words they are made of. The scratch of
// 16-bit instructions comes on top; it is small next to the arena (one
// instruction's operands, widened).
func arenaNeed(p *lower.Program) (int64, error) {
	if p.ArenaBytes < 0 || p.HostBytes < 0 {
		return 0, fmt.Errorf("program %q has a negative arena (%d bytes) or host arena (%d bytes)", p.Name, p.ArenaBytes, p.HostBytes)
	}
	if p.ArenaBytes > maxArenaAlloc || p.HostBytes > maxArenaAlloc {
		return 0, fmt.Errorf("%w: program %q needs an arena of %s and a host arena of %s, more than the cpu backend can allocate (%s)%s",
			lower.ErrDoesNotFit, p.Name, lower.HumanBytes(p.ArenaBytes), lower.HumanBytes(p.HostBytes), lower.HumanBytes(maxArenaAlloc), largestBuffers(p))
	}
	return words(p.ArenaBytes)*8 + words(p.HostBytes)*8, nil
}

// words is how many uint64 hold n bytes; n is at most maxArenaAlloc.
func words(n int64) int64 { return (n + 7) / 8 }

// checkBuffers makes sure every buffer of p lies inside the arena it
// lives in, so the typed views made at load cannot reach past it: a plan
// read from elsewhere, or a planner bug, is an error naming the buffer
// rather than memory corruption or an index panic mid-step.
func checkBuffers(p *lower.Program) error {
	for _, b := range p.Buffers {
		size := p.ArenaBytes
		if b.Host {
			size = p.HostBytes
		}
		if b.Offset < 0 || b.Bytes < 0 || b.Offset > size || b.Bytes > size-b.Offset {
			return fmt.Errorf("program %q: %s at offset %d lies outside its arena of %d bytes", p.Name, lower.DescribeBuffer(b), b.Offset, size)
		}
	}
	return nil
}

// CheckPrograms is the check NewCluster makes before it allocates, for
// programs that one process loads into clusters of their own (a
// generation's prefill and decode programs, each on every device): all
// their arenas must fit the machine together, and a cluster loaded
// after another could only check its own. progs[i] runs on the device
// called names[i].
func CheckPrograms(progs []*lower.Program, names []string, opts Options) error {
	return checkMemory(progs, names, opts)
}

// checkMemory refuses to load progs[i] on the device called names[i]
// (one entry per device this process is about to load) when an arena
// exceeds the device cap or a buffer lies outside its arena, or when all
// the arenas together exceed what opts.HostMemory says the machine can
// still give. The message names the figures and the largest buffers of
// the device that needs most, with the user's lines.
func checkMemory(progs []*lower.Program, names []string, opts Options) error {
	var total, most int64
	worst := 0
	for i, p := range progs {
		if opts.MemoryCap > 0 && p.ArenaBytes > opts.MemoryCap {
			return fmt.Errorf("%s: %w: program %q needs an arena of %d bytes, more than the device cap of %d bytes",
				names[i], lower.ErrDoesNotFit, p.Name, p.ArenaBytes, opts.MemoryCap)
		}
		n, err := arenaNeed(p)
		if err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
		if err := checkBuffers(p); err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
		if n > most {
			most, worst = n, i
		}
		// Each need is at most 2^48 and int64 holds 2^15 of them; past
		// that the sum saturates, which no machine has either.
		total = ir.SatAdd(total, n)
	}
	source := opts.HostMemory
	if source == nil {
		source = HostMemory
	}
	avail, from, ok := source()
	if !ok || total <= avail {
		return nil
	}
	var b strings.Builder
	if len(progs) == 1 {
		fmt.Fprintf(&b, "%s's arena needs %s", names[0], lower.HumanBytes(total))
	} else {
		fmt.Fprintf(&b, "the %d arenas need %s together", len(progs), lower.HumanBytes(total))
	}
	fmt.Fprintf(&b, " but this machine has %s available (%s)", lower.HumanBytes(max(avail, 0)), from)
	if len(progs) > 1 {
		b.WriteString(": the cpu backend's devices share its memory")
	}
	p := progs[worst]
	fmt.Fprintf(&b, "\n  %s: arena %s", names[worst], lower.HumanBytes(p.ArenaBytes))
	if p.HostBytes > 0 {
		fmt.Fprintf(&b, ", host arena %s", lower.HumanBytes(p.HostBytes))
	}
	b.WriteString(largestBuffers(p))
	return fmt.Errorf("%w: %s", lower.ErrDoesNotFit, b.String())
}

// largestBuffers lists p's five largest buffers, with the user's lines,
// so a refusal says what to shrink, shard, recompute or offload.
func largestBuffers(p *lower.Program) string {
	var b strings.Builder
	b.WriteString("\n  largest buffers:")
	for _, id := range p.LargestBuffers(5) {
		b.WriteString("\n    " + lower.DescribeBuffer(p.Buffers[id]))
	}
	return b.String()
}

// Where Linux keeps the figures HostMemory reads; variables so tests can
// point them at files of their own.
var (
	procMeminfo = "/proc/meminfo"
	procStatus  = "/proc/self/status"
	asLimit     = addressSpaceLimit
	cgroups     = []cgroupFiles{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"},
	}
)

// cgroupFiles are where one cgroup version keeps a memory limit, the
// usage, and the statistics whose cache line is reclaimable.
type cgroupFiles struct{ limit, usage, stat, cache string }

// HostMemory is the default MemorySource: MemAvailable from /proc/meminfo
// (what the kernel can hand out without swapping), lowered to the room
// left under the process's cgroup memory limit when there is one, since
// a container is killed at its limit whatever the machine has free, and
// to the room left under its address-space limit (ulimit -v), past which
// the Go runtime cannot allocate the arena and dies. Elsewhere than
// Linux it does not know.
func HostMemory() (int64, string, bool) {
	avail, from, ok := hostMemory()
	if limit, set := asLimit(); set {
		used, known := virtualSize(procStatus)
		if room := max(limit-used, 0); known && (!ok || room < avail) {
			avail, ok, from = room, true, "the address-space limit (ulimit -v) less this process's size in "+procStatus
		}
	}
	return avail, from, ok
}

func hostMemory() (int64, string, bool) {
	avail, ok := memAvailable(procMeminfo)
	from := "MemAvailable in " + procMeminfo
	for _, f := range cgroups {
		limit, ok1 := readInt(f.limit)
		usage, ok2 := readInt(f.usage)
		if !ok1 || !ok2 {
			continue
		}
		// The usage counts page cache the kernel drops before it kills
		// anyone (a build's files, say): without it the working set is
		// what the limit must hold.
		usage -= min(statLine(f.stat, f.cache), usage)
		if room := max(limit-usage, 0); !ok || room < avail {
			avail, ok, from = room, true, "the cgroup memory limit in "+f.limit+" less the working set"
		}
		break
	}
	return avail, from, ok
}

// statLine is the value of key in a cgroup memory.stat file, 0 if absent.
func statLine(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}

// memAvailable reads the MemAvailable line of a meminfo file, in bytes.
func memAvailable(path string) (int64, bool) { return procKB(path, "MemAvailable:") }

// virtualSize is the process's address space in use (VmSize in a
// /proc/PID/status file), in bytes.
func virtualSize(status string) (int64, bool) { return procKB(status, "VmSize:") }

// procKB reads the line "key N kB" of a /proc file, in bytes.
func procKB(path, key string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		rest, found := strings.CutPrefix(line, key)
		if !found {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return ir.SatMul(kb, 1024), true
	}
	return 0, false
}

// readInt reads a file holding one non-negative integer, as cgroup files
// do; "max" (no limit) and anything else unreadable is not known.
func readInt(path string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil && n >= 0
}

// deviceName is how messages name the device of rank r.
func deviceName(r int) string { return "device " + strconv.Itoa(r) }
