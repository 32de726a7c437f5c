// Package cuda runs lowered programs (lower.Program) on NVIDIA GPUs: the
// same programs the CPU backend (runtime/cpu) runs, with the same
// numbers, through the CUDA driver, NVRTC, cuBLASLt and NCCL bound with
// purego, so the project still builds with CGO_ENABLED=0 and needs the
// libraries only when this backend is asked for.
//
// # Runtime
//
// Open loads the libraries, retains the chosen GPU's primary context,
// compiles the kernels of package kernels/cuda once for the GPU's
// architecture (sm_XY, through the NVRTC disk cache), loads them as one
// module and looks up every kernel. A missing library is the bindings'
// error, naming every place searched and the variable that overrides it.
// The context is current per OS thread: every call that touches the GPU
// locks its goroutine to a thread and makes the context current first.
//
// # Devices
//
// A Device is one virtual device running one program. It makes one
// cuMemAlloc arena of Program.ArenaBytes, every buffer at its static
// offset, and one pinned host arena for offloaded buffers; workspace
// (fp32 copies of 16-bit operands, partial sums, collective pieces,
// status words, pipeline send staging, the cuBLASLt workspace) is sized
// while the program is prepared and allocated once, at load (Workspace
// reports it). Nothing is allocated on the device during a step.
//
// Each instruction is prepared once, as its op's entry in the backend's
// op registry says, into a closure that queues kernel launches (geometry
// from the kernel table's launch style and the local shapes; parameter
// arrays built once), cuBLASLt GEMMs (plans chosen at load), copies or
// collectives on the device's compute stream. The preparations mirror
// runtime/cpu op by op and are registered by kind (elementwise.go,
// shape.go, nn.go, optim.go, matmul.go, collective.go, copy.go,
// precision.go, fused.go); HasOp and Ops report which ops the backend
// runs, and an instruction of any other op is an error at load.
// Host-to-device copies of offloaded buffers run on a second stream,
// ordered by events, so a prefetch overlaps the compute before its use.
// A step queues every instruction and synchronizes once at its end; then
// the status words of the kernels that validate token ids and labels are
// checked.
//
// # Fused ops
//
// A fused op (the fuse pass's group of elementwise ops) runs as one
// kernel that package codegen writes from its body, named after the body:
// at load the device collects its program's kernels, and those the
// runtime has not loaded yet are compiled with NVRTC in one unit after
// the kernel program (whose helpers they call) through the disk cache,
// loaded as a module of their own and kept by name, so a body met again
// in another instruction, device or program reuses its kernel. Each
// kernel evaluates every op with its own kernel's expression and keeps
// each intermediate rounded to float, so a fused program computes the
// unfused one's bits.
//
// # Gradient buckets
//
// A data-parallel gradient bucket is reduced on a third stream, the comm
// stream, so that its all-reduce overlaps the rest of the backward: the
// compute stream copies the bucket's gradients into their result buffers
// and records an event, the comm stream waits for it, reduces the results
// in place and records another, which the compute stream waits for before
// the first instruction that touches a result (the optimizer) or runs a
// collective on the same mesh axis. The gradients are free once copied,
// and the results stay live until the optimizer reads them, so nothing
// the comm stream uses is reused by the memory plan before the wait.
// ZeRO's buckets of reduce-scatters cut the gradients into one of two
// staging buffers instead (their results are shards), which the comm
// stream reduce-scatters and copies out of; the cuts into a staging
// buffer wait for the bucket that last read it.
//
// Every kernel works for any block of whole warps and any grid; launches
// take a block sized to the work (a warp for rows of 32) and a few blocks
// per SM, looping over the rest. Config.Launch lowers those bounds (the
// CPU emulator of the kernels, which runs a block's threads on OS
// threads, is fastest with one warp and a few blocks). The geometry is
// fixed at load, so reductions combine in the same order every step.
//
// The measured peak counts live bytes exactly as the CPU device does
// (persistent bytes, plus each temporary from its first write to its last
// use), so it equals the plan's predicted peak. Instructions are timed
// with events only when OnInstr is set.
//
// # Precision
//
// fp32 programs run the fp32 kernels and fp32 cuBLASLt GEMMs (no TF32).
// NVRTC compiles the kernels with --fmad=false: a multiply and an add
// round twice, as in the CPU kernels, instead of once in a fused FMA.
// fp16 and bf16 buffers are emulated as the CPU backend emulates them:
// the 16-bit operands of an instruction are widened into fp32 scratch,
// the fp32 kernels run, and a 16-bit result is rounded back to nearest
// even, bit for bit as the CPU rounds. A matmul whose operands are all of
// one 16-bit format runs as a native cuBLASLt fp16/bf16 GEMM with fp32
// accumulation instead: the same products and one rounding of C, in
// another summation order. f64 programs are refused: they are for CPU
// reference runs.
//
// # Several devices
//
// A Cluster loads a program on every device of its mesh that its process
// holds (one program per pipeline rank) and runs each device on its own
// goroutine, like cpu.Cluster, with the same methods. Virtual devices on
// one GPU (NewCluster, NewPipelineCluster) meet in a host-side rendezvous
// for each collective: events order their streams, and each member
// computes its result from the others' buffers with device-to-device
// copies and the add kernel in group-position order, so sums are
// bit-reproducible and equal the CPU's fixed-order sums. Pipeline sends
// copy into a staging buffer and return at once; receives wait for their
// send (buffered sends, as the CPU backend's comm has). NewNCCLCluster puts
// one device on each GPU of this process, and NewNCCLJobCluster one on
// each GPU of every process of a job, and connects them with NCCL: one
// communicator per group along each mesh axis for collectives, and one per
// ordered pair of pipeline neighbours, whose transfers run on streams of
// their own with the receiver posting in the sender's order (see nccl.go).
//
// Plan prepares a program exactly as Load does without a GPU, which is
// how every instruction's launch plan is checked on machines without one.
package cuda
