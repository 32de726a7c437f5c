// Package cuda holds the CUDA C kernels that the CUDA backend runs for
// every non-GEMM instruction of a lowered program, embedded as source
// text, with a Go table that describes each kernel's signature and launch
// and a map from IR ops to kernels. GEMMs go to cuBLASLt and collectives
// to NCCL; nothing here covers them.
//
// # Sources
//
// common.cuh is the prelude, prepended to the kernel files (elementwise,
// shape, reduce, nn, attention, optim, moe, random .cu); [Program]
// returns the whole unit for NVRTC. The prelude holds the loop helpers,
// block reductions, and the fp16/bf16 conversions written by hand so that
// they round bit for bit as the CPU backend does (github.com/x448/float16
// and kernels/cpu/half.go).
// No file includes a header: the same text compiles under NVRTC, under
// clang -x cuda -nocudainc (the prelude declares what clang then lacks)
// and under g++ through the emulator's shim (package emu).
//
// # Kernel conventions
//
//   - Every kernel is extern "C" __global__ void gc_<name>(…): no
//     templates or overloads at the boundary, so the symbol is the name.
//   - Parameters: outputs first, then inputs, then sizes and scalars.
//     Allowed types are float*, const float*, int*, const int* (i32 token
//     ids, label ids, counts), unsigned char* and const unsigned char*
//     (packed ReLU masks), unsigned short* and const unsigned short*
//     (fp16/bf16 bits), const long long* (the i64 step number, read on the
//     device so one captured program serves every step), long long (sizes),
//     int (small counts and flags) and float (attributes). [Kernels] lists
//     them; a test checks the table against the sources both ways.
//   - Any blockDim.x that is a multiple of 32 up to 1024 works (y and z must
//     be 1), and any grid: elementwise kernels use grid-stride loops, row
//     kernels give one block per row and loop when the grid is smaller.
//     [Kernel.Launch] and [Kernel.Over] say which, and over what extent.
//   - Outputs may alias inputs in elementwise kernels and optimizer updates,
//     as in kernels/cpu; other kernels need disjoint buffers.
//   - Build without fast-math and with IEEE sqrt and division (NVRTC's
//     defaults): the move kernels copy float bits and must keep every
//     pattern, and the tests' tolerances assume IEEE arithmetic.
//
// # Precision
//
// Values are float32. Where a CPU kernel accumulates in float64 (sums,
// dot products, LayerNorm and RMSNorm statistics, log-sum-exp, optimizer
// updates, RoPE's angles and rotations) the CUDA kernel computes in double
// too; exp, log and tanh run in float (expf, logf, tanhf; GELU and SiLU
// through expf). A double that must outlive a kernel (a block's
// partial sum, a row's mean) is stored as a pair of floats, hi + lo.
// Reductions combine in a fixed order for a given block size (warp
// butterflies, then the first warp), so results are reproducible run to
// run. Column reductions (bias, β and γ gradients, Adafactor's and SM3's
// column statistics) split a tile of columns' rows among the block's
// warps and combine the partials in a fixed order too (common.cuh's
// gc_cols): reproducible, and within the last bit of the CPU's serial
// sum rather than equal to it. repeat_interleave's gradient adds each
// slice's few copies in order and matches the CPU bit for bit.
// Row kernels that need a row's statistics before writing it (softmax,
// LayerNorm, RMSNorm, cross-entropy) read it once for them (an online
// softmax, Welford-style moments) and keep it in registers to write when
// it fits (GC_ROW_CACHE values per thread); transposes that move the last
// dim go through 32×33 shared-memory tiles.
// fp16 and bf16 buffers are emulated as the CPU backend does: widen the
// arguments into float32 scratch, run the float32 kernel, round the result
// ([Sixteen]).
//
// # Workspace and multi-launch ops
//
// A few ops need more than one launch or a scratch buffer, listed per op
// by [KernelsFor]: global sums (sum_squares, nonfinite_count) write one
// partial per block and finish in one block; cross-entropy writes a loss
// per row and finishes the mean; Adafactor takes four launches because two
// global norms come before any update; the vocab-parallel cross-entropy
// puts an all-gather and an all-reduce between its kernels; the embedding
// gradient counts, scans and places the token positions by row before the
// rows are summed.
//
// # Errors
//
// A kernel cannot return an error. The ones whose input the runtime
// cannot vouch for (token ids, labels, MoE slot indices) set status[0]
// to 1 on a bad value and carry on without reading out of bounds; the
// caller zeroes the status word before the step, checks it after, and
// names the offending id from its host copy.
//
// # Determinism of the embedding gradient
//
// The embedding gradient adds each vocabulary row's dy rows in position
// order, in float, as the CPU's serial loop does: no float atomics,
// bit-identical results. A counting sort of the positions by row (integer
// atomics, exact in any order) gives each row its positions; the row's
// block sorts them back into position order in shared memory (a row with
// more than 2048 scans the ids in order instead) and adds. Five launches
// over a workspace of rows + count ints; see nn.cu.
package cuda
