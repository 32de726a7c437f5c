package ir

// GradKind says how autodiff treats an op on a path from a param to the
// loss.
type GradKind uint8

const (
	// GradVJP ops are differentiated by their VJP, which package passes
	// registers under the op's name. It is the zero value, so an op that
	// says nothing must have a VJP.
	GradVJP GradKind = iota
	// NoGrad ops have no gradient: their result is an integer, a bit
	// mask, a count or a choice, constant almost everywhere in the
	// arguments. Autodiff treats the result as a constant and stops there.
	NoGrad
	// GradNotImplemented ops have a derivative but no VJP. They are made
	// by passes after autodiff (the VJPs' own ops, collectives, optimizer
	// updates), so only a second derivative would need one; autodiff
	// reports such an op on a path from a param to the loss rather than
	// treating it as a constant, which would drop a gradient silently.
	GradNotImplemented
)

func (k GradKind) String() string {
	return [...]string{"vjp", "none", "not implemented"}[k]
}

// UpdateRole is an op's part in the optimizer step.
type UpdateRole uint8

const (
	// NoUpdate ops compute something other than a new param or state.
	NoUpdate UpdateRole = iota
	// UpdateFromState ops compute the new value of their first argument
	// (a param or optimizer state) from other state: adamw reads the new
	// moments, sgd the new momentum buffer.
	UpdateFromState
	// UpdateFromGrad ops compute the new value of their first argument
	// from a gradient, which is argument UpdateGradArg. The shard pass
	// places that gradient's reduction where the state lives.
	UpdateFromGrad
)

// UpdateGradArg is the argument an UpdateFromGrad op reads its gradient
// from (clipped and unscaled, or not).
const UpdateGradArg = 1

// PrecisionClass is an op's class under mixed precision.
type PrecisionClass uint8

const (
	// PrecisionAuto ops run in the 16-bit dtype when they read a weight or
	// a 16-bit value, and in fp32 otherwise. It is the zero value.
	PrecisionAuto PrecisionClass = iota
	// PrecisionF32 ops compute in fp32 even in mixed precision: 16-bit
	// arguments are cast up and the result stays fp32 (the loss and its
	// gradient, as in PyTorch autocast's fp32 list).
	PrecisionF32
)

func (c PrecisionClass) String() string {
	return [...]string{"auto", "f32"}[c]
}

// CostFunc gives the work of one execution of an op on argument types
// args with result type out, both as one device holds them: the
// floating-point operations and the bytes read plus written. cost.go
// states the conventions.
type CostFunc func(args []Type, out Type, a Attrs) (flops, bytes int64)
