package comm

import (
	"math/bits"
	"sync"
)

// Payload buffers of Net are recycled: a fresh slice per received frame
// cost a clear of its whole length and kept the garbage collector busy,
// about a fifth of the CPU time of a large all-reduce. Buffers come in
// power-of-two classes from minPooled to maxPooled bytes; a larger payload
// (a point-to-point message past maxPooled; collectives cut their data
// into chunks no larger) gets a slice of its own. sync.Pool lets the
// collector take back what a burst left, so the pool never holds more than
// the messages in flight for long.
const (
	minPooledShift = 9
	maxPooledShift = 18
	maxPooled      = 1 << maxPooledShift
)

var bufPools [maxPooledShift - minPooledShift + 1]sync.Pool

// getBuf returns a buffer of n bytes, uninitialised, and the handle to
// give back to putBuf once it is no longer read (nil: not pooled).
func getBuf(n int) ([]byte, *[]byte) {
	if n == 0 {
		return nil, nil
	}
	if n > maxPooled {
		return make([]byte, n), nil
	}
	class := max(bits.Len(uint(n-1)), minPooledShift) - minPooledShift
	if pb, ok := bufPools[class].Get().(*[]byte); ok {
		return (*pb)[:n], pb
	}
	b := make([]byte, 1<<(class+minPooledShift))
	return b[:n], &b
}

// putBuf gives a buffer from getBuf back; nil is ignored.
func putBuf(pb *[]byte) {
	if pb == nil {
		return
	}
	class := bits.Len(uint(cap(*pb)-1)) - minPooledShift
	bufPools[class].Put(pb)
}
