//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package indexed

import (
	"errors"
	"os"
)

// canMap is false here: datasets are read through the file instead.
var canMap = false

func mapFile(*os.File, int64) ([]byte, error) {
	return nil, errors.ErrUnsupported
}

func unmapFile([]byte) error { return nil }
