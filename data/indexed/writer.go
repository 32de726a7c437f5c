package indexed

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gcompile/internal/linkpath"
)

// writeBuffer is the buffer in front of each output file: large enough that
// writes are few, small enough not to matter next to the caller's data.
const writeBuffer = 1 << 20

// Writer builds a dataset one document at a time. Tokens go straight to a
// temporary .bin through a buffer and each document's length straight to a
// temporary .idx, so memory stays constant whatever the number of
// documents or tokens (nothing per document is held in memory; Commit
// re-reads the lengths from the temporary .idx to write the offsets). The
// final PREFIX.bin and PREFIX.idx appear only when Commit succeeds. A
// Writer is not safe for concurrent use.
type Writer struct {
	prefix           string
	dt               DType
	lo, hi           int32 // the ids dt holds; lo is always 0
	bin, idx         *os.File
	binBuf, idxBuf   *bufio.Writer
	docs, tokens     int64
	scratch          []byte
	done             bool  // committed or aborted
	err              error // the first write error; every later call returns it
	binPath, idxPath string
}

// Create starts a dataset under prefix with tokens stored as dt, which must
// be an integer type (see DTypeFor). The temporary files are created at
// once, next to the final ones (PREFIX.bin.tmp-* and PREFIX.idx.tmp-*), so
// an output folder that is missing or not writable fails here, before any
// work, and Commit can rename them into place atomically.
func Create(prefix string, dt DType) (*Writer, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if !dt.Integer() {
		return nil, fmt.Errorf("indexed: create %s: dtype %s: token ids must be stored as an integer type (uint8, int8, int16, int32, int64 or uint16): %w", prefix, dt, ErrDType)
	}
	// A file of the pair that is a link is written where it leads
	// (linkpath.Target), its temporary file beside it.
	w := &Writer{prefix: prefix, dt: dt, binPath: linkpath.Target(prefix + ".bin"), idxPath: linkpath.Target(prefix + ".idx")}
	w.lo, w.hi = dt.Range()
	var err error
	if w.bin, err = os.CreateTemp(filepath.Dir(w.binPath), filepath.Base(w.binPath)+".tmp-*"); err != nil {
		return nil, fmt.Errorf("indexed: create %s: the output folder is not writable: %w", prefix, err)
	}
	if w.idx, err = os.CreateTemp(filepath.Dir(w.idxPath), filepath.Base(w.idxPath)+".tmp-*"); err != nil {
		w.Abort()
		return nil, fmt.Errorf("indexed: create %s: the output folder is not writable: %w", prefix, err)
	}
	// CreateTemp makes files private; a dataset is read by every process
	// of a job, often under other users on a shared file system.
	for _, f := range []*os.File{w.bin, w.idx} {
		if err := f.Chmod(0o644); err != nil {
			w.Abort()
			return nil, fmt.Errorf("indexed: create %s: %w", prefix, err)
		}
	}
	w.binBuf = bufio.NewWriterSize(w.bin, writeBuffer)
	w.idxBuf = bufio.NewWriterSize(w.idx, writeBuffer)
	// The header's counts are not known yet: Commit writes it over these
	// bytes.
	if _, err := w.idxBuf.Write(make([]byte, headerSize)); err != nil {
		w.Abort()
		return nil, fmt.Errorf("indexed: create %s: %w", w.idx.Name(), err)
	}
	return w, nil
}

// CheckPrefix says whether Create could start a dataset under prefix:
// it is not empty, its folder exists, and it is not itself a folder (nor
// ends in a path separator, as a folder's name may). A
// caller that takes a lock or cleans up beside the outputs checks first,
// so a wrong prefix is named as such, not as a file it could not make.
func CheckPrefix(prefix string) error {
	if prefix == "" {
		return errors.New("indexed: create: the output prefix is empty: give a path prefix such as data/corpus (for data/corpus.bin and data/corpus.idx)")
	}
	if strings.HasSuffix(prefix, "/") || strings.HasSuffix(prefix, string(filepath.Separator)) {
		// Such a prefix names a folder, whether or not it exists yet: its
		// files would be DIR/.bin and DIR/.idx, hidden, which no reader
		// finds under DIR.
		return fmt.Errorf("indexed: create %s: the prefix ends in a path separator, so it names a folder; give a path prefix inside it, such as %s", prefix, filepath.Join(prefix, "data"))
	}
	dir := filepath.Dir(prefix)
	if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("indexed: create %s: the output folder %s does not exist: create it first: %w", prefix, dir, fs.ErrNotExist)
	} else if err != nil {
		return fmt.Errorf("indexed: create %s: the output folder: %w", prefix, err)
	} else if !st.IsDir() {
		return fmt.Errorf("indexed: create %s: %s is not a folder", prefix, dir)
	}
	if st, err := os.Stat(prefix); err == nil && st.IsDir() {
		return fmt.Errorf("indexed: create %s: the prefix is a folder; give a path prefix inside it, such as %s", prefix, filepath.Join(prefix, "data"))
	}
	return nil
}

// DType is the type the tokens are stored as.
func (w *Writer) DType() DType { return w.dt }

// Documents is the number of documents added so far.
func (w *Writer) Documents() int64 { return w.docs }

// Tokens is the number of tokens added so far.
func (w *Writer) Tokens() int64 { return w.tokens }

// BinBytes is the size PREFIX.bin will have if Commit is called now, so a
// record describing the dataset can be written before the dataset appears.
func (w *Writer) BinBytes() int64 { return w.tokens * int64(w.dt.Size()) }

// IdxBytes is the size PREFIX.idx will have if Commit is called now: the
// header, a length and an offset per sequence, and docs+1 document indices.
func (w *Writer) IdxBytes() int64 { return headerSize + 12*w.docs + 8*(w.docs+1) }

// Companion is a finished temporary file that belongs beside the dataset,
// such as a record describing it, which Commit renames from Temp to Path.
type Companion struct{ Temp, Path string }

// Add appends one document as one sequence. A token the dtype cannot hold
// is refused with ErrTokenRange before anything of the document is
// written, so the caller may report it and go on or Abort. An empty
// document becomes one sequence of length 0 (Megatron-LM's
// preprocess_data.py records none for it instead; package data/prepare
// leaves empty documents out).
func (w *Writer) Add(tokens []int32) error {
	if err := w.usable(); err != nil {
		return err
	}
	if len(tokens) > math.MaxInt32 {
		return fmt.Errorf("indexed: %s: document %d has %d tokens; a sequence holds at most 2^31-1 (the .idx stores lengths as int32)", w.binPath, w.docs, len(tokens))
	}
	if err := w.writeTokens(tokens); err != nil {
		return err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(tokens)))
	if _, err := w.idxBuf.Write(n[:]); err != nil {
		return w.fail(writeErr(w.idx.Name(), err))
	}
	w.docs++
	w.tokens += int64(len(tokens))
	return nil
}

// writeTokens checks and encodes tokens as the dtype, a bounded piece at a
// time, straight into the output buffer. A token out of range is found
// before anything of the document reaches the buffer, so a refused
// document leaves no trace.
func (w *Writer) writeTokens(tokens []int32) error {
	if i := w.outOfRange(tokens); i >= 0 {
		return fmt.Errorf("indexed: %s: document %d, token %d is %d, which %s cannot hold (%d..%d): store the dataset as int32 (what DTypeFor gives a vocabulary of 65500 tokens or more): %w",
			w.binPath, w.docs, i, tokens[i], w.dt, w.lo, w.hi, ErrTokenRange)
	}
	const piece = 64 << 10
	size := w.dt.Size()
	if cap(w.scratch) < piece*size {
		w.scratch = alignedBytes(piece * size)
	}
	for len(tokens) > 0 {
		t := tokens[:min(len(tokens), piece)]
		tokens = tokens[len(t):]
		b := w.scratch[:len(t)*size]
		encodeTokens(b, t, w.dt)
		if _, err := w.binBuf.Write(b); err != nil {
			return w.fail(writeErr(w.bin.Name(), err))
		}
	}
	return nil
}

// outOfRange is the index of the first token the dtype cannot hold, or -1.
// Valid ids are 0..hi, so as unsigned numbers they are exactly those not
// above hi (a negative id becomes a huge one): one branch-free pass finds
// whether any is out, and only then a second finds which.
func (w *Writer) outOfRange(tokens []int32) int {
	hi := uint32(w.hi)
	var top uint32
	for _, t := range tokens {
		top = max(top, uint32(t))
	}
	if top <= hi {
		return -1
	}
	for i, t := range tokens {
		if uint32(t) > hi {
			return i
		}
	}
	return -1
}

func (w *Writer) usable() error {
	if w.done {
		return fmt.Errorf("indexed: writer for %s: %w (after Commit or Abort)", w.prefix, ErrClosed)
	}
	return w.err
}

// writeErr is a failed write to file: the os error names the file and
// the op itself, which a second "write FILE" only repeated.
func writeErr(file string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("indexed: %w", err)
	}
	return fmt.Errorf("indexed: write %s: %w", file, err)
}

func (w *Writer) fail(err error) error {
	w.err = err
	return err
}

// Commit finishes the dataset: it writes the offsets, document indices and
// header to the .idx, syncs both files to disk and renames them to
// PREFIX.bin and PREFIX.idx, then syncs the folder. Every write and sync
// comes before the first change under the final names, so a failure of
// one (a full disk) leaves an existing dataset, and its companions, as
// they were.
//
// The names then change in this order: the existing PREFIX.idx is
// removed, each companion is renamed into place, then the new .bin and
// last the new .idx. Until the .idx arrives no dataset is under the
// prefix (a .bin without an .idx opens as none), so a crash at any point
// leaves the old dataset with its old companions, no dataset, or the new
// one with its new companions: never a pair beside another pair's record,
// and never a new pair without its record. On any error the temporary
// .bin and .idx are removed and nothing of this Writer is left under the
// final names; the companions' temporary files are the caller's.
func (w *Writer) Commit(companions ...Companion) error {
	if err := w.usable(); err != nil {
		w.Abort()
		return err
	}
	if err := w.commit(companions); err != nil {
		w.Abort()
		return fmt.Errorf("indexed: commit %s: %w", w.prefix, err)
	}
	w.done = true
	return nil
}

func (w *Writer) commit(companions []Companion) error {
	if err := w.binBuf.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", w.bin.Name(), err)
	}
	if err := w.bin.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", w.bin.Name(), err)
	}
	if err := w.idxBuf.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", w.idx.Name(), err)
	}
	if err := w.writeIndexTail(); err != nil {
		return fmt.Errorf("write %s: %w", w.idx.Name(), err)
	}
	var h [headerSize]byte
	copy(h[:], magic)
	binary.LittleEndian.PutUint64(h[9:], 1)
	h[17] = byte(w.dt)
	binary.LittleEndian.PutUint64(h[18:], uint64(w.docs))
	binary.LittleEndian.PutUint64(h[26:], uint64(w.docs+1))
	if _, err := w.idx.WriteAt(h[:], 0); err != nil {
		return fmt.Errorf("write %s: %w", w.idx.Name(), err)
	}
	if err := w.idx.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", w.idx.Name(), err)
	}
	for _, f := range []*os.File{w.bin, w.idx} {
		if err := f.Close(); err != nil {
			return fmt.Errorf("close %s: %w", f.Name(), err)
		}
	}
	if err := os.Remove(w.idxPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace the existing %s: %w", w.idxPath, err)
	}
	// From here a failure leaves no dataset: what this Writer renamed into
	// place is removed again, so the caller's error means nothing written.
	var placed []string
	undo := func() {
		for i := len(placed) - 1; i >= 0; i-- {
			os.Remove(placed[i]) // the .idx first: never a pair without its record
		}
	}
	for _, c := range companions {
		if err := os.Rename(c.Temp, c.Path); err != nil {
			undo()
			return err
		}
		placed = append(placed, c.Path)
	}
	if err := os.Rename(w.bin.Name(), w.binPath); err != nil {
		undo()
		return err
	}
	placed = append(placed, w.binPath)
	if err := os.Rename(w.idx.Name(), w.idxPath); err != nil {
		undo()
		return err
	}
	placed = append(placed, w.idxPath)
	for _, dir := range slices.Compact([]string{filepath.Dir(w.binPath), filepath.Dir(w.idxPath)}) {
		if err := syncDir(dir); err != nil {
			// Everything is in place but the names may not survive a crash.
			undo()
			return fmt.Errorf("sync the folder %s: %w", dir, err)
		}
	}
	return nil
}

// writeIndexTail appends the sequence offsets (computed from the lengths
// written so far, read back from the file) and the document indices
// 0..docs. The lengths are read with ReadAt, which leaves the file's write
// offset at the end.
func (w *Writer) writeIndexTail() error {
	lens := bufio.NewReaderSize(io.NewSectionReader(w.idx, headerSize, 4*w.docs), writeBuffer)
	out := bufio.NewWriterSize(w.idx, writeBuffer)
	var b [8]byte
	size := int64(w.dt.Size())
	ptr := int64(0)
	for range w.docs {
		if _, err := io.ReadFull(lens, b[:4]); err != nil {
			return fmt.Errorf("read back the sequence lengths: %w", err)
		}
		n := int64(binary.LittleEndian.Uint32(b[:4]))
		binary.LittleEndian.PutUint64(b[:], uint64(ptr))
		if _, err := out.Write(b[:]); err != nil {
			return err
		}
		ptr += n * size
	}
	for k := range w.docs + 1 {
		binary.LittleEndian.PutUint64(b[:], uint64(k))
		if _, err := out.Write(b[:]); err != nil {
			return err
		}
	}
	return out.Flush()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Abort removes the temporary files; nothing is left under the final
// names. It may be called any number of times, also after a failed Add or
// Commit, and does nothing after a successful Commit.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	for _, f := range []*os.File{w.bin, w.idx} {
		if f != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}
}
