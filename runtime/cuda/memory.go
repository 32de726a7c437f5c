package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cuda/driver"
)

// space is one of a device's memories.
type space uint8

const (
	// inArena: the program's arena, every buffer at its static offset.
	inArena space = iota
	// inHost: the pinned host arena of offloaded buffers.
	inHost
	// inScratch: workspace one instruction uses while it runs (16-bit
	// widening, partial sums, collective pieces); every instruction
	// starts again at offset 0, so its size is the largest need.
	inScratch
	// inKeep: workspace that outlives an instruction (pipeline send
	// staging).
	inKeep
	// inStatus: the status words of the kernels that validate ids, which
	// the step checks at its end; they come first in the keep allocation.
	inStatus
)

// loc is a place in one of a device's memories.
type loc struct {
	sp  space
	off int64
}

func (l loc) add(n int64) loc { return loc{l.sp, l.off + n} }

// wsAlign is the alignment of workspace regions (cudaMalloc's).
const wsAlign = 256

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// bump hands out workspace regions at load.
type bump struct{ cur, high int64 }

func (b *bump) take(n int64) int64 {
	off := alignUp(b.cur, wsAlign)
	b.cur = off + max(n, 1)
	b.high = max(b.high, b.cur)
	return off
}

// Workspace is what a device allocates beside its arena, all of it once,
// at load: nothing is allocated on the device during a step.
type Workspace struct {
	// Scratch is the largest workspace one instruction needs (fp32
	// copies of 16-bit operands, partial sums, collective pieces).
	Scratch int64
	// Keep holds the per-instruction status words and pipeline send
	// staging (one region per send).
	Keep int64
	// GEMM is the cuBLASLt workspace: the most any chosen algorithm needs.
	GEMM int64
}

// Total is the sum of the parts.
func (w Workspace) Total() int64 { return w.Scratch + w.Keep + w.GEMM }

// memories are a loaded device's allocations.
type memories struct {
	arena, scratch, keep, gemm driver.DevicePtr
	host                       driver.HostMem
}

// ptr is the device address of a device-side location.
func (d *Device) ptr(l loc) driver.DevicePtr {
	switch l.sp {
	case inScratch:
		return d.mem.scratch.Add(uint64(l.off))
	case inKeep:
		return d.mem.keep.Add(uint64(d.statusBytes() + l.off))
	case inStatus:
		return d.mem.keep.Add(uint64(l.off))
	}
	return d.mem.arena.Add(uint64(l.off))
}

// hostBytes is the pinned host memory of an offloaded location.
func (d *Device) hostBytes(l loc, n int64) (driver.HostMem, error) {
	return d.mem.host.Slice(uint64(l.off), uint64(n))
}

// at is where a buffer lives.
func at(b lower.Buffer) loc {
	if b.Host {
		return loc{inHost, b.Offset}
	}
	return loc{inArena, b.Offset}
}

// checkDTypes rejects programs the kernels cannot run: f64 exists for the
// CPU backend's reference runs only.
func checkDTypes(p *lower.Program) error {
	for _, b := range p.Buffers {
		switch b.Type.DType {
		case ir.F32, ir.F16, ir.BF16, ir.I32, ir.I64, ir.U8:
		case ir.F64:
			return fmt.Errorf("program %q: %s is %v: the cuda backend runs f32/f16/bf16 programs; f64 is for CPU reference runs", p.Name, bufferName(b), b.Type)
		default:
			return fmt.Errorf("program %q: %s is %v: the cuda backend has no %v storage", p.Name, bufferName(b), b.Type, b.Type.DType)
		}
	}
	return nil
}

func bufferName(b lower.Buffer) string {
	if b.Name != "" {
		return fmt.Sprintf("%s %q", b.Kind, b.Name)
	}
	if b.Value != nil {
		return fmt.Sprintf("%s (%s)", b.Value.Op, b.Value.Where())
	}
	return fmt.Sprintf("buffer %d", b.ID)
}
