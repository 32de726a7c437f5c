// Package badshape multiplies matrices whose inner dims differ (line 12).
package badshape

import "gcompile/frontend"

// Model is broken on purpose.
func Model(b *frontend.Builder) {
	x := b.Param("x", []int{4, 8}, frontend.Normal(1), frontend.NoParallel)
	w := b.Param("w", []int{16, 2}, frontend.Normal(1), frontend.NoParallel)
	// The next line is the shape error the test expects.

	y := x.MatMul(w)
	b.Loss(y.Sum())
}
