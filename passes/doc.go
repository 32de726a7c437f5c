// Package passes holds gcompile's compiler passes and the table that orders
// them (pipeline.go). A pass is a plain function over an *ir.Module; one
// pass, one file, its tests beside it. Rules that belong to a pass and are
// keyed by op live beside it too: the autodiff VJPs in autodiff_vjp.go.
//
// Run applies the table to a module, skipping the passes the module says
// have already run (so a dumped .gir resumes where it stopped), timing each
// pass, hashing the module to tell whether it changed, optionally verifying
// after every pass, and turning a panic inside a pass into an error that
// names the pass.
package passes
