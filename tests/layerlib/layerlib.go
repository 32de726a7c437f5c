// Package layerlib is a layer library of a user's own, outside the
// frontend, for the test that frontend.RegisterLibrary makes ops recorded
// inside it report the user's line.
package layerlib

import "gcompile/frontend"

// Twice is x + x.
func Twice(x *frontend.Tensor) *frontend.Tensor {
	return x.Add(x)
}
