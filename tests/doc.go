// Package tests holds end-to-end checks of gcompile against tools nobody
// here wrote.
//
// The oracle test (oracle_test.go) builds the reference GPT
// (examples/gpt) with gcompile, runs one forward and backward step on the
// CPU runtime, and rebuilds the same network node by node in
// gorgonia.org/gorgonia, an independent autodiff engine, with the very same
// weights and tokens. The loss and the gradient of every parameter must
// agree: to 1e-9 relative in float64, and in float32 to the rounding a
// float32 computation carries (see oracle_test.go for the tolerances and
// the measured figures).
package tests
