// Package ir is gcompile's graph intermediate representation.
//
// A training step is one SSA graph held by a Module: every Value is produced
// by one op from earlier values, so the slice Module.Values is already a
// topological order and a pass can walk it front to back. The parts:
//
//	Type       element type (DType) and static shape of a value
//	Op table   one OpInfo per op kind: arity, attribute schema, type rule
//	Value      %ID = op args : type {attrs place meta} @file:line
//	Meta       what later passes cut and schedule by: layer, phase, stage, chunk
//	Pos        the user's model.go line that created the value; it survives
//	           every pass so any diagnostic can point at the user's code
//	Mesh       named device axes (dp, pp, tp, ep) and their sizes
//	Placement  per mesh axis: R (replicated), S(d) (sharded on dim d), P (partial sum)
//	Module     values in program order plus named outputs (the loss, gradients)
//	           and updates (state value ← new value, applied after a step)
//
// State is functional, as in JAX: parameters and optimizer state are source
// values (op param or state) and a step produces their next versions, listed
// in Module.Updates. The runtime writes those back between steps.
//
// The text form (.gir) is the dump format and a test input; Print and Parse
// round-trip exactly. Verify checks SSA order, op arity, attributes, types
// and shapes, placements against the mesh, and outputs/updates. Every
// verifier message starts with where it is: the pass, the value and its
// user position.
package ir
