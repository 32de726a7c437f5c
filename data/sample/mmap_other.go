//go:build !unix

package sample

import (
	"fmt"
	"os"
)

// mapFile reads a cache file whole where memory mapping is not available:
// lookups stay correct, only the memory saving is lost.
func mapFile(path string) ([]byte, func() error, error) {
	if err := regular(path); err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if len(b) < headerSize {
		return nil, nil, fmt.Errorf("%w: %s has %d bytes, less than a header", errStale, path, len(b))
	}
	return b, func() error { return nil }, nil
}
