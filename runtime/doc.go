// Package runtime executes lowered programs and measures them. It holds
// what every backend shares: the Device interface a backend implements,
// the training loop (learning-rate schedule, data feeding, evaluation),
// the metrics JSON of the CLI contract, and Chrome trace output. Backends
// live in sub-packages: runtime/cpu (virtual CPU devices) and, later,
// runtime/cuda. Checkpoints (safetensors) are in runtime/checkpoint.
package runtime
