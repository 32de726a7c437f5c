// Package badtype has a Go type error on line 10.
package badtype

import "gcompile/frontend"

// Model is broken on purpose.
func Model(b *frontend.Builder) {
	x := b.Param("x", []int{2, 2}, frontend.Zeros, frontend.NoParallel)
	b.Loss(x.Sum())
	var n int = "two"
	_ = n
}
