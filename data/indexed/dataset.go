package indexed

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"gcompile/internal/filekind"
)

// Dataset is an open, validated dataset. Its methods are safe for
// concurrent use, except Close, which must not overlap any other call.
type Dataset struct {
	prefix           string
	idxPath, binPath string
	x                index
	idxMapped        bool
	// bin is PREFIX.bin mapped into memory; when the system cannot map
	// files, bin is nil and binFile is read through instead.
	bin     []byte
	binFile *os.File
	idxInfo fs.FileInfo
	binInfo fs.FileInfo
	closed  atomic.Bool

	fpOnce sync.Once
	fp     string
	// cfp is ContentFingerprint's.
	cfpOnce sync.Once
	cfp     string

	maxMu    sync.Mutex
	maxKnown bool
	maxTok   int32
}

// Open maps PREFIX.idx and PREFIX.bin and checks that they form one dataset
// as Megatron-LM writes it (see the package comment for what is checked).
// The checks read the .idx once and only the size of the .bin, so Open
// takes time in proportion to the number of sequences, never to the number
// of tokens, and the tokens stay on disk until Read asks for them.
func Open(prefix string) (*Dataset, error) {
	d := &Dataset{prefix: prefix, idxPath: prefix + ".idx", binPath: prefix + ".bin"}
	if err := d.open(); err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

func (d *Dataset) open() error {
	idxF, idxInfo, err := openRegular(d.idxPath, d.prefix)
	if err != nil {
		return err
	}
	defer idxF.Close()
	d.idxInfo = idxInfo
	var data []byte
	if canMap && idxInfo.Size() >= headerSize {
		if data, err = mapFile(idxF, idxInfo.Size()); err != nil {
			return fmt.Errorf("%s: memory-map %d bytes: %w", d.idxPath, idxInfo.Size(), err)
		}
		d.idxMapped = true
	} else if data, err = readAll(idxF, idxInfo.Size()); err != nil {
		return fmt.Errorf("%s: %w", d.idxPath, err)
	}
	d.x.data = data // so that release unmaps it whatever parseIndex says
	if d.x, err = parseIndex(d.idxPath, data); err != nil {
		return err
	}
	if d.idxMapped {
		// Validation read every length and pointer; a run then reads only
		// the few its samples need. Dropping the pages keeps the process's
		// resident memory from growing with the number of sequences.
		dropPages(data)
	}

	binF, binInfo, err := openRegular(d.binPath, d.prefix)
	if err != nil {
		return err
	}
	d.binInfo = binInfo
	if have, want := binInfo.Size(), d.x.binSize; have != want {
		binF.Close()
		tokens := want / int64(d.x.dtype.Size())
		if have < want {
			return fileErr(d.binPath, ErrTruncated, "the file has %d bytes, but %s describes %d bytes (%d sequences, %d tokens of %s)", have, d.idxPath, want, d.x.nseq, tokens, d.x.dtype)
		}
		return fileErr(d.binPath, ErrFormat, "the file has %d bytes, but %s describes %d bytes (%d sequences, %d tokens of %s): %d bytes too many; the .bin and .idx are not from the same run", have, d.idxPath, want, d.x.nseq, tokens, d.x.dtype, have-want)
	}
	if canMap {
		bin, err := mapFile(binF, binInfo.Size())
		binF.Close()
		if err != nil {
			return fmt.Errorf("%s: memory-map %d bytes: %w", d.binPath, binInfo.Size(), err)
		}
		adviseRandom(bin)
		d.bin = bin
		return nil
	}
	d.binFile = binF
	return nil
}

// openRegular opens one of the dataset's files, saying what a dataset is
// when it is missing. It checks that the path is a regular file before
// opening it: opening a FIFO for reading waits for a writer, so a FIFO
// (or a pipe from process substitution) in place of the .idx or .bin would
// hang the run before any check could refuse it.
func openRegular(path, prefix string) (*os.File, fs.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			hint := ""
			if strings.HasSuffix(prefix, ".bin") || strings.HasSuffix(prefix, ".idx") {
				hint = "; give the prefix without .bin or .idx"
			}
			return nil, nil, fmt.Errorf("dataset %s: %w (a dataset is PREFIX.bin and PREFIX.idx, as gcompile data prepare or Megatron-LM's tools/preprocess_data.py write them%s)", prefix, err, hint)
		}
		return nil, nil, err
	}
	if err := regular(path, info); err != nil {
		return nil, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	// The file read is the one opened: a path replaced since the Stat is
	// checked again.
	if info, err = f.Stat(); err != nil {
		f.Close()
		return nil, nil, err
	}
	if err := regular(path, info); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, info, nil
}

// regular refuses anything but a regular file: a folder, a FIFO, a device
// or a socket cannot be one of a dataset's files.
func regular(path string, info fs.FileInfo) error {
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: not a regular file (%s)", path, ErrFormat, filekind.Of(info.Mode()))
	}
	return nil
}

func readAll(f *os.File, size int64) ([]byte, error) {
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%d bytes do not fit this system's address space", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("read %d bytes: %w", size, err)
	}
	return b, nil
}

// release frees what open took, whether or not it finished.
func (d *Dataset) release() error {
	var errs []error
	if d.idxMapped {
		errs = append(errs, unmapFile(d.x.data))
		d.idxMapped = false
	}
	d.x.data = nil
	if d.bin != nil {
		errs = append(errs, unmapFile(d.bin))
		d.bin = nil
	}
	if d.binFile != nil {
		errs = append(errs, d.binFile.Close())
		d.binFile = nil
	}
	return errors.Join(errs...)
}

// Close unmaps the files. A second Close does nothing; any other method
// called after Close returns ErrClosed or a zero value.
func (d *Dataset) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	if err := d.release(); err != nil {
		return fmt.Errorf("dataset %s: close: %w", d.prefix, err)
	}
	return nil
}

// Prefix is the path prefix the dataset was opened with, for messages.
func (d *Dataset) Prefix() string { return d.prefix }

// DType is how the tokens are stored, which bounds the ids the dataset can
// hold.
func (d *Dataset) DType() DType { return d.x.dtype }

// NumSequences is the number of sequences: one per document for datasets
// written by Writer, more when Megatron split documents into sentences.
func (d *Dataset) NumSequences() int {
	if d.closed.Load() {
		return 0
	}
	return d.x.nseq
}

// NumDocuments is the number of documents (one less than the length of the
// document indices array, which starts with 0).
func (d *Dataset) NumDocuments() int {
	if d.closed.Load() {
		return 0
	}
	return d.x.ndocIdx - 1
}

// Tokens is the total number of tokens, which sizes an epoch.
func (d *Dataset) Tokens() int64 {
	return d.x.binSize / int64(max(d.x.dtype.Size(), 1))
}

// SequenceLen is the number of tokens of sequence i, or 0 for an i outside
// [0, NumSequences()) (where Read then fails with ErrBounds).
func (d *Dataset) SequenceLen(i int) int {
	if i < 0 || i >= d.x.nseq || d.closed.Load() {
		return 0
	}
	return d.x.seqLen(i)
}

// Documents is a copy of the document indices: document k is sequences
// [Documents()[k], Documents()[k+1]). It costs one allocation of
// 8·(NumDocuments()+1) bytes, so callers should keep it rather than call it
// per document.
func (d *Dataset) Documents() []int64 {
	if d.closed.Load() {
		return nil
	}
	out := make([]int64, d.x.ndocIdx)
	for k := range out {
		out[k] = d.x.docIdx(k)
	}
	return out
}

// Read copies tokens [offset, offset+len(dst)) of sequence seq into dst as
// int32 ids. It fails with ErrBounds outside the sequence, with
// ErrTokenRange when a stored id is negative or above 2^31-1 (possible
// only in signed or int64 datasets), and with an error naming the .bin when
// the file was truncated after Open.
func (d *Dataset) Read(seq, offset int, dst []int32) (err error) {
	if d.closed.Load() {
		return fmt.Errorf("dataset %s: read: %w", d.prefix, ErrClosed)
	}
	if seq < 0 || seq >= d.x.nseq {
		return fmt.Errorf("dataset %s: sequence %d does not exist (the dataset has %d, 0..%d): %w", d.prefix, seq, d.x.nseq, d.x.nseq-1, ErrBounds)
	}
	n := d.x.seqLen(seq)
	if offset < 0 || offset > n || len(dst) > n-offset {
		return fmt.Errorf("dataset %s: tokens [%d, %d) of sequence %d, which has %d tokens: %w", d.prefix, offset, int64(offset)+int64(len(dst)), seq, n, ErrBounds)
	}
	if len(dst) == 0 {
		return nil
	}
	size := d.x.dtype.Size()
	off := d.x.seqPtr(seq) + int64(offset)*int64(size)
	defer catchFault(debug.SetPanicOnFault(true), &err, d.binPath)
	var b []byte
	if d.bin != nil {
		b = d.bin[off : off+int64(len(dst)*size)]
	} else {
		buf := alignedBytes(len(dst) * size)
		if err := d.readAt(buf, off); err != nil {
			return err
		}
		b = buf
	}
	if bad := decode(dst, b, d.x.dtype); bad >= 0 {
		return fileErr(d.binPath, ErrTokenRange, "sequence %d, token %d holds %d, which is not a valid token id (0..2^31-1)", seq, offset+bad, tokenAt(b, bad, d.x.dtype))
	}
	return nil
}

// readAt fills buf from the .bin at off, when the file is read through
// rather than mapped. Running out of file means it shrank after Open.
func (d *Dataset) readAt(buf []byte, off int64) error {
	_, err := d.binFile.ReadAt(buf, off)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%s: %w: the file shrank after Open (reading %d bytes at %d)", d.binPath, ErrTruncated, len(buf), off)
	}
	return fmt.Errorf("%s: read %d bytes at %d: %w", d.binPath, len(buf), off, err)
}

// catchFault turns a memory fault while touching a mapped file (the file
// was truncated after Open) into an error instead of a crash. Use it as
//
//	defer catchFault(debug.SetPanicOnFault(true), &err, name)
//
// so that faults panic from the defer statement on and the setting is
// restored on return; any other panic is raised again.
func catchFault(old bool, err *error, name string) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		if _, ok := r.(interface{ Addr() uintptr }); ok {
			*err = fmt.Errorf("%s: %w: the file changed after Open (a fault reading it: %v)", name, ErrTruncated, r)
			return
		}
		panic(r)
	}
}

// alignedBytes is a buffer of n bytes aligned for any token type, so that
// the fast conversions apply to it as they do to a mapping.
func alignedBytes(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafeBytes(w)[:n]
}

// Fingerprint identifies the dataset's contents cheaply, for cache keys: a
// hash of both files' sizes and modification times and of the first and
// last MiB of each. Rewriting either file changes it; reading the whole
// .bin to be sure would cost as much as the work the cache saves.
func (d *Dataset) Fingerprint() string {
	d.fpOnce.Do(func() { d.fp = d.fingerprint(true) })
	return d.fp
}

// ContentFingerprint is Fingerprint without the modification times: the
// same for a copy of the dataset on another machine or file system, so a
// checkpoint's record of the data it trained on still matches there. It
// sees the sizes and both ends of each file, not every byte between.
func (d *Dataset) ContentFingerprint() string {
	d.cfpOnce.Do(func() { d.cfp = d.fingerprint(false) })
	return d.cfp
}

func (d *Dataset) fingerprint(times bool) (fp string) {
	h := sha256.New()
	var num [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(num[:], uint64(v))
		h.Write(num[:])
	}
	h.Write([]byte("gcompile indexed fingerprint v1\n"))
	if d.idxInfo == nil || d.binInfo == nil || d.closed.Load() {
		return "closed"
	}
	for _, info := range []fs.FileInfo{d.idxInfo, d.binInfo} {
		put(info.Size())
		if times {
			put(info.ModTime().UnixNano())
		}
	}
	const part = 1 << 20
	var err error
	func() {
		defer catchFault(debug.SetPanicOnFault(true), &err, d.binPath)
		hashEnds(h, d.x.data, part)
		if d.bin != nil || d.binFile == nil {
			hashEnds(h, d.bin, part)
			return
		}
		size := d.binInfo.Size()
		for _, r := range ends(size, part) {
			buf := make([]byte, r[1]-r[0])
			if rerr := d.readAt(buf, r[0]); rerr != nil {
				err = rerr
				return
			}
			h.Write(buf)
		}
	}()
	if err != nil {
		// The identity still changes with the sizes and times; the error
		// text keeps it from matching a fingerprint of readable files.
		h.Write([]byte(err.Error()))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ends are the byte ranges of the first and last part bytes of a file of
// size bytes (one range when they meet).
func ends(size, part int64) [][2]int64 {
	if size <= 2*part {
		return [][2]int64{{0, size}}
	}
	return [][2]int64{{0, part}, {size - part, size}}
}

func hashEnds(h io.Writer, b []byte, part int64) {
	for _, r := range ends(int64(len(b)), part) {
		h.Write(b[r[0]:r[1]])
	}
}
