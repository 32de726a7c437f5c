package indexed

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
)

// scanChunk is how much of the .bin one scan step covers: large enough that
// the per-step costs vanish, a multiple of every page size, and small
// enough that two workers keep little of the file resident at a time.
const scanChunk = 8 << 20

// scanWorkers caps the goroutines of one scan; beyond a few, a scan is
// bound by memory or disk bandwidth rather than by the cores.
const scanWorkers = 8

// MaxToken is the largest token id in the dataset, or -1 when it holds no
// tokens. It reads the whole .bin once (in 8 MiB chunks, on up to
// GOMAXPROCS goroutines, releasing each chunk from the process's memory
// once scanned), so callers should prefer an id recorded when the dataset
// was made (package data/prepare's metadata) or cache it under
// Fingerprint; the result is also kept for the Dataset's lifetime. It fails
// with ErrTokenRange, naming the sequence and position, when a stored id is
// negative or above 2^31-1.
func (d *Dataset) MaxToken() (int32, error) {
	if d.closed.Load() {
		return 0, fmt.Errorf("dataset %s: max token: %w", d.prefix, ErrClosed)
	}
	d.maxMu.Lock()
	defer d.maxMu.Unlock()
	if d.maxKnown {
		return d.maxTok, nil
	}
	m, err := d.scanMax()
	if err != nil {
		return 0, err
	}
	d.maxTok, d.maxKnown = m, true
	return m, nil
}

// chunkResult is what one chunk of the scan found.
type chunkResult struct {
	lo, hi int64
	err    error
}

func (d *Dataset) scanMax() (int32, error) {
	size := d.x.binSize
	if size == 0 {
		return -1, nil
	}
	nChunks := int((size + scanChunk - 1) / scanChunk)
	results := make([]chunkResult, nChunks)
	workers := min(runtime.GOMAXPROCS(0), scanWorkers, nChunks)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			if d.bin == nil {
				buf = alignedBytes(scanChunk)
			}
			for {
				c := int(next.Add(1) - 1)
				if c >= nChunks {
					return
				}
				results[c] = d.scanChunk(c, buf)
				if results[c].err != nil {
					next.Store(int64(nChunks)) // stop the others early
					return
				}
			}
		}()
	}
	wg.Wait()
	hi := int64(math.MinInt64)
	for c, r := range results {
		if r.err != nil {
			return 0, r.err
		}
		if r.lo < 0 || r.hi > math.MaxInt32 {
			return 0, d.badToken(c)
		}
		hi = max(hi, r.hi)
	}
	return int32(hi), nil
}

// chunkBytes is chunk c of the .bin: a slice of the mapping, or read into
// buf when the file is not mapped.
func (d *Dataset) chunkBytes(c int, buf []byte) ([]byte, error) {
	off := int64(c) * scanChunk
	end := min(off+scanChunk, d.x.binSize)
	if d.bin != nil {
		return d.bin[off:end], nil
	}
	b := buf[:end-off]
	if err := d.readAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

func (d *Dataset) scanChunk(c int, buf []byte) (r chunkResult) {
	defer catchFault(debug.SetPanicOnFault(true), &r.err, d.binPath)
	b, err := d.chunkBytes(c, buf)
	if err != nil {
		return chunkResult{err: err}
	}
	r.lo, r.hi = bytesMinMax(b, d.x.dtype)
	if d.bin != nil {
		dropPages(b)
	}
	return r
}

// badToken names the first invalid id of chunk c: its sequence and position
// in that sequence, found by a binary search over the sequence offsets.
func (d *Dataset) badToken(c int) error {
	buf := []byte(nil)
	if d.bin == nil {
		buf = alignedBytes(scanChunk)
	}
	b, err := d.chunkBytes(c, buf)
	if err != nil {
		return err
	}
	size := d.x.dtype.Size()
	for i := 0; i < len(b)/size; i++ {
		v := tokenAt(b, i, d.x.dtype)
		if v >= 0 && v <= math.MaxInt32 {
			continue
		}
		off := int64(c)*scanChunk + int64(i*size)
		seq := sort.Search(d.x.nseq, func(j int) bool { return d.x.seqPtr(j) > off }) - 1
		pos := (off - d.x.seqPtr(seq)) / int64(size)
		return fileErr(d.binPath, ErrTokenRange, "sequence %d, token %d (byte %d) holds %d, which is not a valid token id (0..2^31-1)", seq, pos, off, v)
	}
	return fileErr(d.binPath, ErrTokenRange, "chunk at byte %d holds an id outside 0..2^31-1", int64(c)*scanChunk)
}
