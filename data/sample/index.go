package sample

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"gcompile/internal/filekind"
)

// The on-disk format. Every file starts with a 128-byte little-endian
// header; an epoch index follows it with its document order, the window
// starts as (position, offset) pairs side by side so that one lookup reads
// one cache line, and the window order, each value width bytes wide.
const (
	headerSize = 128
	// formatVersion changes whenever the bytes of a file or what they
	// mean change, so older files stop matching by name and by header.
	// Version 2 added the body's checksum: version 1 files (whose names
	// hash version 1) are no longer looked up, and each index is built
	// once more as version 2.
	formatVersion = 2
	kindSummary   = 1
	kindEpoch     = 2
	flagOrder     = 1 // the document order is stored (else it is 0, 1, …)
	flagShuffle   = 2 // the window order is stored (else it is 0, 1, …)
	// bodyCRCAt holds the CRC-32C of everything after the header; crcAt the
	// CRC-32 of the header before it, body checksum included.
	bodyCRCAt = 104
	crcAt     = 108
)

// castagnoli is CRC-32C, which hash/crc32 computes with the processor's
// CRC instructions on amd64 and arm64.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// magic opens every index file, so a stray file is never read as one.
var magic = [8]byte{'G', 'C', 'S', 'M', 'P', 'I', 'D', 'X'}

// errStale is an index file that exists but is not the one wanted: a
// corrupt, truncated or foreign file. It is rebuilt, never reported.
var errStale = errors.New("index file does not match")

// header is what an index file says about itself; a file is used only when
// its header equals the one expected, field for field.
type header struct {
	kind    uint32
	key     [32]byte
	docs    uint64
	tokens  uint64
	maxLen  uint64
	seq     uint64
	samples uint64
	width   uint32
	flags   uint32
	size    uint64
}

// encode is the header's bytes, with body the CRC-32C of the bytes that
// follow it (0 for an empty body).
func (h *header) encode(body uint32) []byte {
	b := make([]byte, headerSize)
	le := binary.LittleEndian
	copy(b[0:8], magic[:])
	le.PutUint32(b[8:], formatVersion)
	le.PutUint32(b[12:], h.kind)
	copy(b[16:48], h.key[:])
	le.PutUint64(b[48:], h.docs)
	le.PutUint64(b[56:], h.tokens)
	le.PutUint64(b[64:], h.maxLen)
	le.PutUint64(b[72:], h.seq)
	le.PutUint64(b[80:], h.samples)
	le.PutUint32(b[88:], h.width)
	le.PutUint32(b[92:], h.flags)
	le.PutUint64(b[96:], h.size)
	le.PutUint32(b[bodyCRCAt:], body)
	le.PutUint32(b[crcAt:], crc32.ChecksumIEEE(b[:crcAt]))
	return b
}

func decodeHeader(b []byte) (header, error) {
	var h header
	if len(b) < headerSize || !bytes.Equal(b[0:8], magic[:]) {
		return h, fmt.Errorf("%w: no index header", errStale)
	}
	le := binary.LittleEndian
	if le.Uint32(b[crcAt:]) != crc32.ChecksumIEEE(b[:crcAt]) {
		return h, fmt.Errorf("%w: header checksum", errStale)
	}
	if v := le.Uint32(b[8:]); v != formatVersion {
		return h, fmt.Errorf("%w: format version %d, want %d", errStale, v, formatVersion)
	}
	h.kind = le.Uint32(b[12:])
	copy(h.key[:], b[16:48])
	h.docs = le.Uint64(b[48:])
	h.tokens = le.Uint64(b[56:])
	h.maxLen = le.Uint64(b[64:])
	h.seq = le.Uint64(b[72:])
	h.samples = le.Uint64(b[80:])
	h.width = le.Uint32(b[88:])
	h.flags = le.Uint32(b[92:])
	h.size = le.Uint64(b[96:])
	return h, nil
}

// epochLayout is where an epoch index's three arrays start, and the size of
// the file; order or shuffle is -1 when the array is not stored.
type epochLayout struct {
	order, starts, shuffle int64
	size                   int64
}

func layoutOf(docs, samples int64, width int, flags uint32) epochLayout {
	w := int64(width)
	l := epochLayout{order: -1, shuffle: -1}
	at := int64(headerSize)
	if flags&flagOrder != 0 {
		l.order = at
		at += w * docs
	}
	l.starts = at
	at += w * 2 * samples
	if flags&flagShuffle != 0 {
		l.shuffle = at
		at += w * samples
	}
	l.size = at
	return l
}

// epochIndex is one epoch's index, mapped from its file or held in memory.
type epochIndex struct {
	data     []byte
	release  func() error
	width    int
	lay      epochLayout
	fromDisk bool
	used     uint64 // the GPT's clock at the last lookup, for eviction
}

// at is element i of the array that starts at byte off. Callers keep i
// within the array, whose bounds the header check has matched to the
// file's size.
func (x *epochIndex) at(off, i int64) uint64 {
	if x.width == 4 {
		return uint64(binary.LittleEndian.Uint32(x.data[off+4*i:]))
	}
	return binary.LittleEndian.Uint64(x.data[off+8*i:])
}

func (x *epochIndex) close() error {
	if x.release == nil {
		return nil
	}
	err := x.release()
	x.release, x.data = nil, nil
	return err
}

// encoder writes fixed-width little-endian values through a buffer, so a
// build of millions of values makes a few hundred writes.
// It sums what it writes, for the header's body checksum.
type encoder struct {
	w     io.Writer
	buf   []byte
	width int
	crc   uint32
	err   error
}

func newEncoder(w io.Writer, width int) *encoder {
	return &encoder{w: w, buf: make([]byte, 0, 1<<16), width: width}
}

func (e *encoder) put(v uint64) {
	if e.width == 4 {
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(v))
	} else {
		e.buf = binary.LittleEndian.AppendUint64(e.buf, v)
	}
	if len(e.buf) >= cap(e.buf)-8 {
		e.flush()
	}
}

func (e *encoder) flush() {
	if e.err == nil && len(e.buf) > 0 {
		e.crc = crc32.Update(e.crc, castagnoli, e.buf)
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

// writeEpoch writes the body of an epoch index (after its header) for
// values of type T, and returns its CRC-32C.
func writeEpoch[T uint32 | uint64](w io.Writer, g *GPT, seed, epoch int64, width int) (uint32, error) {
	e := newEncoder(w, width)
	var order []T
	if g.cfg.Shuffle {
		order = identity[T](g.docs)
		shuffle(order, stream(seed, epoch, streamDocs))
		for _, v := range order {
			e.put(uint64(v))
		}
	}
	docLen := func(p int64) (int64, error) {
		d := p
		if order != nil {
			d = int64(order[p])
		}
		n := g.tok.SequenceLen(g.lo + int(d))
		if n < 0 {
			return 0, fmt.Errorf("%w: document %d has length %d", ErrDataset, g.lo+int(d), n)
		}
		return int64(n), nil
	}
	// Window j starts at token j*seq of the epoch's stream: walk the
	// documents once, carrying the offset over each document's end.
	seq := int64(g.cfg.Seq)
	var p, off int64
	cur, err := docLen(0)
	if err != nil {
		return 0, err
	}
	for range g.samples {
		for off >= cur {
			off -= cur
			p++
			if p >= g.docs {
				return 0, fmt.Errorf("%w: the documents of the range hold fewer tokens than the %d cached for them: the dataset changed but its Identity did not", ErrCorrupt, g.tokens)
			}
			if cur, err = docLen(p); err != nil {
				return 0, err
			}
		}
		e.put(uint64(p))
		e.put(uint64(off))
		off += seq
	}
	if g.cfg.Shuffle {
		perm := identity[T](g.samples)
		shuffle(perm, stream(seed, epoch, streamSamples))
		for _, v := range perm {
			e.put(uint64(v))
		}
	}
	e.flush()
	return e.crc, e.err
}

// writeAtomic writes a file of the cache through a temporary file renamed
// into place, so a reader never sees half a file: processes that build the
// same file at once each write the same bytes, and the last rename wins.
// A crash leaves only a temporary file, or a complete one. fill may write
// the header last, once the body's checksum is known, with WriteAt.
func writeAtomic(dir, name string, fill func(*os.File) error) error {
	fix := "give the samples a writable cache folder (--data-cache-dir)"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: %w; %s", ErrCache, err, fix)
	}
	f, err := os.CreateTemp(dir, "."+name+".*.tmp")
	if err != nil {
		return fmt.Errorf("%w: %w; %s", ErrCache, err, fix)
	}
	tmp := f.Name()
	fail := func(err error) error {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := fill(f); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return fail(fmt.Errorf("%w: %w; %s", ErrCache, err, fix))
		}
		return fail(err)
	}
	// CreateTemp makes the file private; the other processes of a job may
	// run as other users of a shared folder.
	if err := f.Chmod(0o644); err != nil {
		return fail(fmt.Errorf("%w: %w; %s", ErrCache, err, fix))
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%w: %w; %s", ErrCache, err, fix)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%w: %w; %s", ErrCache, err, fix)
	}
	return nil
}

// buildLock serializes the processes of a job (or of several jobs over one
// cache folder) that find file name missing from dir at once: the first to
// take the lock builds the file while the others wait, then find it built.
// Without it every process built the same index at the same time (two
// processes took 2.7 times as long as one, on the same disk). The lock is
// a file beside the index, removed once the index is in place; a process
// that waited on the removed one finds the index when it looks again, and
// one that arrives later never needs the lock. Locking is best effort: a
// folder the lock cannot be made in is left to writeAtomic to report.
// unlock releases it.
func buildLock(dir, name string) (unlock func()) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() {}
	}
	path := filepath.Join(dir, "."+name+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		// Another user's lock in a shared folder: flock needs only a
		// descriptor, which reading gives.
		if f, err = os.Open(path); err != nil {
			return func() {}
		}
	}
	if err := lockExclusive(f); err != nil {
		_ = f.Close()
		return func() {}
	}
	return func() {
		_ = os.Remove(path)
		_ = f.Close() // releases the lock
	}
}

// openFile maps path and checks its header against want with check, and
// its body against the header's checksum; a file that is missing comes
// back as an error for which errors.Is(err, fs.ErrNotExist) holds, and one
// that exists but does not match as errStale.
//
// The body's checksum is what catches a value overwritten by another one
// in range, which the lookups' bounds checks cannot see. Checking it reads
// the whole file once per mapping: CRC-32C runs at about 6 GB/s on one
// amd64 core, so a file of a few hundred MB (an epoch of billions of
// tokens) costs some 50 ms plus reading it from disk, once per epoch a
// process maps; its pages then stay in the page cache, shared by the job's
// processes, where the kernel may drop them again under pressure.
func openFile(path string, check func(header) error) (header, []byte, func() error, error) {
	b, release, err := mapFile(path)
	if err != nil {
		return header{}, nil, nil, err
	}
	h, err := decodeHeader(b)
	if err == nil {
		err = check(h)
	}
	if err == nil && h.size != uint64(len(b)) {
		err = fmt.Errorf("%w: %d bytes, the header says %d", errStale, len(b), h.size)
	}
	if err == nil {
		if got, want := crc32.Checksum(b[headerSize:], castagnoli), binary.LittleEndian.Uint32(b[bodyCRCAt:]); got != want {
			err = fmt.Errorf("%w: body checksum %08x, the header says %08x", errStale, got, want)
		}
	}
	if err != nil {
		_ = release()
		return header{}, nil, nil, err
	}
	// The checksum read the file in order, helped by the kernel's
	// read-ahead; lookups from now on read a few pages at random places,
	// where read-ahead would only fill memory.
	adviseRandom(b)
	return h, b, release, nil
}

// regular checks that a cache file is a regular file before it is opened:
// opening a FIFO for reading waits for a writer, so a FIFO where an index
// file belongs would hang the run. Anything else there is stale, and the
// rebuild renames a new file over it.
func regular(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file (%s)", errStale, path, filekind.Of(st.Mode()))
	}
	return nil
}

// widthFor is the narrowest width that holds every value of an epoch
// index: document positions, offsets within a document and window numbers.
func widthFor(docs, maxLen, samples int64) int {
	if docs <= math.MaxUint32 && maxLen <= math.MaxUint32 && samples <= math.MaxUint32 {
		return 4
	}
	return 8
}
