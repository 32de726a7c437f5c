package indexed

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"gcompile/internal/filekind"
)

// magic opens every .idx Megatron-LM writes.
var magic = []byte("MMIDIDX\x00\x00")

// headerSize is the fixed part of an .idx: magic, version, dtype code,
// sequence count and document count.
const headerSize = 9 + 8 + 1 + 8 + 8

// maxCount bounds the sequence and document counts so that the .idx size
// they imply (34 + 12·S + 8·D) cannot overflow an int64; any count above it
// describes a file larger than any filesystem holds.
const maxCount = 1 << 58

// index is a validated .idx: its bytes and where its arrays start.
type index struct {
	data    []byte
	dtype   DType
	nseq    int   // sequence count
	ndocIdx int   // length of the document indices array (documents + 1)
	lens    int   // byte offset of the int32 sequence lengths
	ptrs    int   // byte offset of the int64 sequence pointers
	docs    int   // byte offset of the int64 document indices
	binSize int64 // the size PREFIX.bin must have
}

func (x *index) seqLen(i int) int {
	return int(int32(binary.LittleEndian.Uint32(x.data[x.lens+4*i:])))
}

func (x *index) seqPtr(i int) int64 {
	return int64(binary.LittleEndian.Uint64(x.data[x.ptrs+8*i:]))
}

func (x *index) docIdx(k int) int64 {
	return int64(binary.LittleEndian.Uint64(x.data[x.docs+8*k:]))
}

// parseIndex checks that data, the contents of the .idx file name, is a
// dataset exactly as Megatron-LM writes it (see the package comment) and
// returns its layout. It reads the header and every array entry once and
// never panics, whatever data holds.
func parseIndex(name string, data []byte) (index, error) {
	var x index
	if len(data) < len(magic) {
		if !bytes.HasPrefix(magic, data) {
			return x, fileErr(name, ErrFormat, "the magic is %q, want %q: not a Megatron-LM .idx file", data, magic)
		}
		return x, fileErr(name, ErrTruncated, "the file has %d bytes, the header alone takes %d", len(data), headerSize)
	}
	if !bytes.Equal(data[:len(magic)], magic) {
		return x, fileErr(name, ErrFormat, "the magic is %q, want %q: not a Megatron-LM .idx file (the .bin and .idx may be swapped, or this is the older fairseq-style index)", data[:len(magic)], magic)
	}
	if len(data) < headerSize {
		return x, fileErr(name, ErrTruncated, "the file has %d bytes, the header alone takes %d", len(data), headerSize)
	}
	if v := binary.LittleEndian.Uint64(data[9:]); v != 1 {
		return x, fileErr(name, ErrVersion, "version is %d, want 1 (the only version Megatron-LM writes)", v)
	}
	x.dtype = DType(data[17])
	switch {
	case !x.dtype.known():
		return x, fileErr(name, ErrDType, "dtype code is %d, want one of Megatron's codes 1..8", data[17])
	case !x.dtype.Integer():
		return x, fileErr(name, ErrDType, "dtype is %s (code %d): token ids must be integers (uint8, int8, int16, int32, int64 or uint16), so this is not a token dataset", x.dtype, data[17])
	}
	nseq := binary.LittleEndian.Uint64(data[18:])
	ndoc := binary.LittleEndian.Uint64(data[26:])
	if nseq > maxCount || ndoc > maxCount {
		return x, fileErr(name, ErrFormat, "the header says %d sequences and %d document indices, which would need more than 2^63 bytes", nseq, ndoc)
	}
	need := int64(headerSize) + 12*int64(nseq) + 8*int64(ndoc)
	if have := int64(len(data)); have != need {
		if have < need {
			return x, fileErr(name, ErrTruncated, "the header says %d sequences and %d document indices, which take %d bytes; the file has %d", nseq, ndoc, need, have)
		}
		if have-need == int64(nseq) && nseq > 0 {
			return x, fileErr(name, ErrFormat, "%d bytes after the document indices, one per sequence: a multimodal dataset (with sequence modes), which is not supported", have-need)
		}
		return x, fileErr(name, ErrFormat, "the header says %d sequences and %d document indices, which take %d bytes; the file has %d (%d bytes too many)", nseq, ndoc, need, have, have-need)
	}
	if ndoc == 0 {
		return x, fileErr(name, ErrFormat, "document count is 0, want at least 1: the document indices start with 0")
	}
	// need ≤ len(data) here, so both counts fit an int.
	x.data, x.nseq, x.ndocIdx = data, int(nseq), int(ndoc)
	x.lens = headerSize
	x.ptrs = x.lens + 4*x.nseq
	x.docs = x.ptrs + 8*x.nseq

	size := int64(x.dtype.Size())
	var next int64 // where the next sequence must start, in bytes
	for i := 0; i < x.nseq; i++ {
		n := x.seqLen(i)
		if n < 0 {
			return x, fileErr(name, ErrFormat, "sequence_lengths[%d] is %d, want ≥ 0", i, n)
		}
		if p := x.seqPtr(i); p != next {
			if i == 0 {
				return x, fileErr(name, ErrFormat, "sequence_pointers[0] is %d, want 0: the first sequence starts the .bin", p)
			}
			return x, fileErr(name, ErrFormat, "sequence_pointers[%d] is %d, want %d (sequence %d starts at byte %d and has %d tokens of %d bytes): each sequence must follow the previous one, as Megatron writes them",
				i, p, next, i-1, x.seqPtr(i-1), x.seqLen(i-1), size)
		}
		if int64(n)*size > math.MaxInt64-next {
			return x, fileErr(name, ErrFormat, "sequence_lengths[%d] is %d: the .bin would pass 2^63 bytes", i, n)
		}
		next += int64(n) * size
	}
	prev := int64(0)
	for k := 0; k < x.ndocIdx; k++ {
		d := x.docIdx(k)
		switch {
		case k == 0 && d != 0:
			return x, fileErr(name, ErrFormat, "document_indices[0] is %d, want 0", d)
		case d < prev:
			return x, fileErr(name, ErrFormat, "document_indices[%d] is %d, below document_indices[%d] = %d: the indices must not decrease", k, d, k-1, prev)
		case d > int64(x.nseq):
			return x, fileErr(name, ErrFormat, "document_indices[%d] is %d, past the sequence count %d", k, d, x.nseq)
		}
		prev = d
	}
	if prev != int64(x.nseq) {
		return x, fileErr(name, ErrFormat, "the last document index is %d, want the sequence count %d: sequences %d..%d belong to no document", prev, x.nseq, prev, x.nseq-1)
	}
	x.binSize = next
	return x, nil
}

// IsIndexFile reports whether the file at path starts as an .idx does
// (Megatron-LM's magic): a writer about to replace PREFIX.idx, or the
// PREFIX.bin beside it, asks whether they are a dataset's before it
// destroys someone's other file of that name.
func IsIndexFile(path string) (bool, error) {
	// Stat before opening: opening a FIFO for reading waits for a writer.
	fi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("%s: not a regular file (%s)", path, filekind.Of(fi.Mode()))
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, len(magic))
	if _, err := io.ReadFull(f, head); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	return bytes.Equal(head, magic), nil
}
