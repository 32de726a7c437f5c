// Package schedule is gcompile's pipeline-schedule IR: the per-rank order in
// which a pipeline-parallel step runs its forward and backward work, its
// point-to-point transfers, its gradient sync and its optimizer step.
//
// A schedule is data, not code, for the same reason the graph is: a later pass
// lowers it into per-rank programs, a dump prints it, a test diffs it, and a
// hand-edited text file can replace a generated one. Each rank owns a list of
// Actions executed strictly in order. Chunks are numbered globally in model
// order (0..p·v−1) and chunk j lives on rank j mod p, which is Megatron's
// interleaved assignment and, for v = 1, the plain one-stage-per-rank layout.
// Transfers are explicit actions rather than something implied by the
// compute order, so that the lowered program and the simulator see exactly the
// same sends and receives; none are emitted between chunks that share a rank,
// whose data never leaves the device.
//
// The compact text form ("0F0 0sf0>r1 1B3 1sb3>r0 sync opt") is what dumps
// show and what Parse reads back. Generators build the classic schedules
// (GPipe, 1F1B/PipeDream-flush, interleaved 1F1B, PipeDream-2BW and the
// zero-bubble ZB-H1), but nothing trusts a generator: Simulate executes all
// ranks' lists together with blocking receives and buffered sends, and rejects
// a schedule that would deadlock, leaves a transfer unmatched, runs work on the
// wrong rank, or misses or repeats a (chunk, microbatch). Given per-action
// costs the same run yields the step time, the bubble fraction and the peak
// number of stashed activations, which is how the generators are held to the
// figures in the literature.
package schedule
