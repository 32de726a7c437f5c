package data

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// TrainBatch draws batch windows of seq+1 bytes at uniformly random offsets
// in the training split and returns them as next-byte prediction pairs,
// each flattened row-major to batch*seq tokens: inputs[r*seq+i] is byte i of
// window r and targets[r*seq+i] is byte i+1.
//
// The result depends only on (seed, step), so a run resumed at step k sees
// the same batches it would have seen without stopping. It returns nil
// slices when batch or seq is not positive or the split is too small
// (see Check).
func (c *Corpus) TrainBatch(seed int64, step, batch, seq int) (inputs, targets []int32) {
	if c == nil || !validShape(batch, seq) || len(c.Train) <= seq+1 {
		return nil, nil
	}
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(step)))
	n := len(c.Train) - seq - 1
	inputs = make([]int32, batch*seq)
	targets = make([]int32, batch*seq)
	for r := range batch {
		fill(inputs[r*seq:(r+1)*seq], targets[r*seq:(r+1)*seq], c.Train, rng.IntN(n))
	}
	return inputs, targets
}

// EvalBatch returns the index-th fixed evaluation batch, laid out like
// TrainBatch. It uses no seed at all, so every run evaluates on the same
// windows and averaging EvalBatch(0..k-1) gives losses comparable across
// runs. Window j = index*batch+r starts at j*stride mod (len(Eval)-seq-1),
// with stride near the golden-ratio point of that range and coprime to it:
// successive windows then land far apart and cover the split evenly
// before any offset repeats. It returns nil slices for a negative index,
// a non-positive batch or seq, or a split that is too small (see Check).
func (c *Corpus) EvalBatch(index, batch, seq int) (inputs, targets []int32) {
	if c == nil || index < 0 || !validShape(batch, seq) || len(c.Eval) <= seq+1 {
		return nil, nil
	}
	n := uint64(len(c.Eval) - seq - 1)
	stride := evalStride(n)
	inputs = make([]int32, batch*seq)
	targets = make([]int32, batch*seq)
	first := uint64(index) * uint64(batch) // wraps only past 2^64 windows
	for r := range batch {
		j := (first + uint64(r)) % n
		hi, lo := bits.Mul64(j, stride)
		off := bits.Rem64(hi, lo, n)
		fill(inputs[r*seq:(r+1)*seq], targets[r*seq:(r+1)*seq], c.Eval, int(off))
	}
	return inputs, targets
}

// validShape rejects sizes whose product would not fit in an int, which
// would otherwise make the allocation fail.
func validShape(batch, seq int) bool {
	return batch > 0 && seq > 0 && batch <= math.MaxInt/seq
}

// evalStride picks a step close to n/phi that shares no factor with n, so
// j*stride mod n visits every offset once per n windows and consecutive
// windows are well separated.
func evalStride(n uint64) uint64 {
	if n <= 2 {
		return 1
	}
	s := uint64(float64(n) * 0.6180339887498949)
	if s == 0 {
		s = 1
	}
	for gcd(s, n) != 1 {
		s++
	}
	return s
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// fill copies the window text[off:off+len(in)+1] into in and its one-byte
// shift into out.
func fill(in, out []int32, text []byte, off int) {
	w := text[off : off+len(in)+1]
	for i := range in {
		in[i] = int32(w[i])
		out[i] = int32(w[i+1])
	}
}
