// Package frontend is gcompile's Go DSL: a model is ordinary Go code that
// calls methods on *Tensor values (x.MatMul(w), x.Add(b), x.Softmax()) and
// records them into an ir.Module through a *Builder.
//
// Each recorded op carries the file:line of the user's call (the first
// caller outside the frontend packages), so shape errors and every later
// compiler diagnostic name the user's line. A DSL error does not panic: the
// Builder keeps the first error of each chain, the failed Tensor is
// poisoned so later ops on it are skipped quietly, and Build returns all the
// errors together.
//
// Model parameters (layers, hidden, …) are read with Builder.Int and friends
// from the --set key=value list; unknown keys are errors. Parallel hints
// (column/row/vocab parallel, layer boundaries) are recorded as IR
// attributes and metadata for the sharding and pipeline passes.
//
// A model file is a Go package with a function func(*frontend.Builder);
// LoadModel type-checks it with go/packages, builds a small driver around
// it and runs the driver to obtain the module.
package frontend
