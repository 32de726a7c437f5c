//go:build amd64 && !purego

package cpu

// Implemented in gemm_amd64.s.

//go:noescape
func sgemm12x32UnitAVX512(kc int, a *float32, csa int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func sgemm12x32RowsAVX512(kc int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func sgemm6x16UnitAVX2(kc int, a *float32, csa int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func sgemm6x16RowsAVX2(kc int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func sgemmPackT4x8(dst, src *float32, lds, ldd, r4, n8 int)

func fmaPeakAVX512(n int)
func fmaPeakAVX2(n int)
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

// The assembly kernels. Both have the same kc blocking and accumulation
// order as every other kernel, so which one runs changes speed, not bits.
var (
	sgemmAVX512 = &sgemmKernel{
		name: "avx512-12x32", mr: 12, nr: 32, nc: 1024,
		unit: sgemm12x32UnitAVX512, rows: sgemm12x32RowsAVX512, packT4x8: sgemmPackT4x8,
	}
	sgemmAVX2 = &sgemmKernel{
		name: "avx2-6x16", mr: 6, nr: 16, nc: 1024,
		unit: sgemm6x16UnitAVX2, rows: sgemm6x16RowsAVX2, packT4x8: sgemmPackT4x8,
	}
)

// x86 feature bits: CPUID leaf 1 ECX, leaf 7 EBX, and XCR0.
const (
	cpuidFMA      = 1 << 12
	cpuidOSXSAVE  = 1 << 27
	cpuidAVX      = 1 << 28
	cpuid7AVX2    = 1 << 5
	cpuid7AVX512F = 1 << 16
	// xcr0AVX: the OS saves SSE and the upper halves of ymm.
	xcr0AVX = 1<<1 | 1<<2
	// xcr0AVX512: also the opmask registers, the upper halves of zmm0–15
	// and zmm16–31. Without them a context switch would corrupt the
	// kernel's registers, however the CPU is marked.
	xcr0AVX512 = xcr0AVX | 1<<5 | 1<<6 | 1<<7
)

// x86Features reports which of the assembly kernels this CPU and OS can
// run. It reads CPUID directly so the package needs no dependency for it.
func x86Features() (avx2FMA, avx512 bool) {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	if ecx1&cpuidOSXSAVE == 0 || ecx1&cpuidAVX == 0 || ecx1&cpuidFMA == 0 {
		return false, false
	}
	xcr0, _ := xgetbv()
	_, ebx7, _, _ := cpuid(7, 0)
	avx2FMA = xcr0&xcr0AVX == xcr0AVX && ebx7&cpuid7AVX2 != 0
	avx512 = avx2FMA && xcr0&xcr0AVX512 == xcr0AVX512 && ebx7&cpuid7AVX512F != 0
	return avx2FMA, avx512
}

// sgemmKernels lists the kernels this machine can run, fastest first; the
// first is the one gemm32 uses. The portable kernel is always last.
var sgemmKernels = func() []*sgemmKernel {
	avx2FMA, avx512 := x86Features()
	var ks []*sgemmKernel
	if avx512 {
		ks = append(ks, sgemmAVX512)
	}
	if avx2FMA {
		ks = append(ks, sgemmAVX2)
	}
	return append(ks, sgemmGeneric)
}()
