package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"gcompile/internal/jsonerr"
	"gcompile/internal/linkpath"
	"gcompile/runtime"
)

// metadataKey is the reserved header key for free-form string metadata; a
// tensor may not use it as its name.
const metadataKey = "__metadata__"

// MaxHeaderLength bounds the JSON header Read accepts. It matches the limit
// of the reference safetensors implementation and keeps a corrupted length
// field from triggering a huge allocation.
const MaxHeaderLength = 100 << 20

// Sentinel errors name the rule a file or tensor list broke, so callers can
// react with errors.Is instead of matching message text.
var (
	// ErrHeaderLength: the 8-byte length prefix is missing, points past
	// the end of the file, or exceeds MaxHeaderLength.
	ErrHeaderLength = errors.New("bad header length")
	// ErrHeader: the header is not UTF-8 JSON of the expected structure.
	ErrHeader = errors.New("malformed header")
	// ErrDType: a dtype outside the supported set.
	ErrDType = errors.New("unknown dtype")
	// ErrShape: a negative dimension, or a shape too large to address.
	ErrShape = errors.New("invalid shape")
	// ErrDataSize: a tensor's byte count is not product(shape) times the
	// dtype size.
	ErrDataSize = errors.New("data size does not match shape and dtype")
	// ErrOffsets: data offsets that overlap, leave gaps, or fall outside
	// the data section.
	ErrOffsets = errors.New("invalid data offsets")
	// ErrDuplicate: two tensors with the same name.
	ErrDuplicate = errors.New("duplicate tensor name")
	// ErrName: an empty, reserved or non-UTF-8 tensor name.
	ErrName = errors.New("invalid tensor name")
)

// dtypeSizes lists the supported safetensors dtypes and their element
// sizes in bytes.
var dtypeSizes = map[string]int{
	"BOOL": 1,
	"U8":   1,
	"F16":  2,
	"BF16": 2,
	"F32":  4,
	"I32":  4,
	"F64":  8,
	"I64":  8,
}

// DTypeSize reports the element size of a safetensors dtype, so callers
// can size buffers without duplicating the dtype table. ok is false for
// unsupported dtypes.
func DTypeSize(dtype string) (size int, ok bool) {
	size, ok = dtypeSizes[dtype]
	return size, ok
}

func knownDTypes() string {
	names := make([]string, 0, len(dtypeSizes))
	for k := range dtypeSizes {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// Tensor is one named array as stored in a file. Data holds the raw
// little-endian, row-major bytes, so any dtype round-trips without
// conversion; use Float32Bytes and BytesFloat32 for F32 weights.
type Tensor struct {
	Name  string
	DType string
	// Shape lists the dimensions; empty (or nil) means a scalar.
	Shape []int
	Data  []byte
}

// byteSize returns product(shape)·elemSize, rejecting negative dimensions
// and sizes that overflow int64.
func byteSize(shape []int, elemSize int) (int64, error) {
	n := int64(elemSize)
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is %d: %w", i, d, ErrShape)
		}
		if d != 0 && n > math.MaxInt64/int64(d) {
			return 0, fmt.Errorf("shape %v overflows 64-bit sizes: %w", shape, ErrShape)
		}
		n *= int64(d)
	}
	return n, nil
}

// plan checks tensors and metadata and returns the tensor indices in name
// order, the order they are laid out in the file.
func plan(tensors []Tensor, metadata map[string]string) ([]int, error) {
	seen := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("tensor %d has an empty name: %w", i, ErrName)
		case t.Name == metadataKey:
			return nil, fmt.Errorf("tensor %d is named %q, which the format reserves for metadata: %w", i, t.Name, ErrName)
		case !utf8.ValidString(t.Name):
			return nil, fmt.Errorf("tensor %d name %q is not valid UTF-8: %w", i, t.Name, ErrName)
		case seen[t.Name]:
			return nil, fmt.Errorf("tensor %q appears twice: %w", t.Name, ErrDuplicate)
		}
		seen[t.Name] = true
		size, ok := dtypeSizes[t.DType]
		if !ok {
			return nil, fmt.Errorf("tensor %q: dtype %q is not one of %s: %w", t.Name, t.DType, knownDTypes(), ErrDType)
		}
		want, err := byteSize(t.Shape, size)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if int64(len(t.Data)) != want {
			return nil, fmt.Errorf("tensor %q: data is %d bytes, but shape %v of %s needs %d: %w",
				t.Name, len(t.Data), t.Shape, t.DType, want, ErrDataSize)
		}
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("metadata entry %q: %q is not valid UTF-8: %w", k, v, ErrHeader)
		}
	}
	order := make([]int, len(tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(tensors[a].Name, tensors[b].Name) })
	return order, nil
}

// appendJSONString writes s as a JSON string. HTML escaping is off so
// names such as "a<b" stay readable in the header.
func appendJSONString(b *bytes.Buffer, s string) error {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("encode %q: %w", s, err)
	}
	b.Truncate(b.Len() - 1) // Encode ends with a newline
	return nil
}

// encodeHeader builds the padded JSON header: metadata first, then tensors
// in layout order with contiguous offsets, then spaces up to a multiple of
// 8 bytes so the data section that follows the 8-byte length is aligned.
func encodeHeader(tensors []Tensor, order []int, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	sep := ""
	if len(metadata) > 0 {
		b.WriteString(`"` + metadataKey + `":{`)
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := appendJSONString(&b, k); err != nil {
				return nil, err
			}
			b.WriteByte(':')
			if err := appendJSONString(&b, metadata[k]); err != nil {
				return nil, err
			}
		}
		b.WriteByte('}')
		sep = ","
	}
	var offset int64
	for _, i := range order {
		t := tensors[i]
		b.WriteString(sep)
		sep = ","
		if err := appendJSONString(&b, t.Name); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, `:{"dtype":"%s","shape":[`, t.DType)
		for j, d := range t.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, d)
		}
		end := offset + int64(len(t.Data))
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, offset, end)
		offset = end
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// Write encodes tensors in safetensors format. Tensors are laid out in
// name order whatever their order in the slice, and metadata keys are
// sorted, so equal inputs always produce identical bytes. An empty
// metadata map writes no "__metadata__" entry. Nothing is written when
// validation fails.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	if err := write(w, tensors, metadata); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

func write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	order, err := plan(tensors, metadata)
	if err != nil {
		return err
	}
	header, err := encodeHeader(tensors, order, metadata)
	if err != nil {
		return err
	}
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(header)))
	if _, err := w.Write(prefix[:]); err != nil {
		return fmt.Errorf("write header length: %w", err)
	}
	if _, err := w.Write(header); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	for _, i := range order {
		if _, err := w.Write(tensors[i].Data); err != nil {
			return fmt.Errorf("write tensor %q: %w", tensors[i].Name, err)
		}
	}
	return nil
}

// Save writes a safetensors file to path via a temporary file beside it
// and a rename, so
// a crash or error mid-save leaves any previous checkpoint at path intact
// and never leaves a truncated file under the real name. Invalid tensors
// are rejected before any file is created.
func Save(path string, tensors []Tensor, metadata map[string]string) error {
	if _, err := save(path, tensors, metadata); err != nil {
		return fmt.Errorf("writing the weights file %s: %w", path, err)
	}
	return nil
}

// Sum is a written file's size and CRC-32C (Castagnoli) checksum, which
// a sharded checkpoint's manifest records and its load verifies.
type Sum struct {
	Bytes  int64  `json:"bytes"`
	CRC32C string `json:"crc32c"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func save(path string, tensors []Tensor, metadata map[string]string) (sum Sum, err error) {
	if _, err := plan(tensors, metadata); err != nil {
		return Sum{}, err
	}
	path = linkpath.Target(path)
	// A temporary name of its own: path+".tmp" could be a user's file.
	f, err := runtime.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return Sum{}, fmt.Errorf("create temporary file: %w", err)
	}
	tmp := f.Name()
	closed := false
	defer func() {
		if err != nil {
			if !closed {
				_ = f.Close() // already failing; the write error matters more
			}
			_ = os.Remove(tmp)
		}
	}()
	crc := crc32.New(castagnoli)
	counted := &countingWriter{w: io.MultiWriter(f, crc)}
	bw := bufio.NewWriterSize(counted, 1<<20)
	if err := write(bw, tensors, metadata); err != nil {
		return Sum{}, fileErr("write", tmp, err)
	}
	if err := bw.Flush(); err != nil {
		return Sum{}, fileErr("write", tmp, err)
	}
	faultPoint("file written, not synced")
	if err := f.Sync(); err != nil {
		return Sum{}, fileErr("sync", tmp, err)
	}
	closed = true
	if err := f.Close(); err != nil {
		return Sum{}, fmt.Errorf("close %s: %w", tmp, err)
	}
	faultPoint("file synced, not renamed")
	if err := os.Rename(tmp, path); err != nil {
		return Sum{}, fmt.Errorf("rename temporary file: %w", err)
	}
	syncDir(filepath.Dir(path))
	// A save of this file killed before (a requeued run's) left its
	// temporary file, as large as the weights.
	runtime.RemoveStaleTemps(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	return Sum{Bytes: counted.n, CRC32C: fmt.Sprintf("%08x", crc.Sum32())}, nil
}

// fileErr is err of op on path, which names the path once: the file's
// own errors (*fs.PathError) already say the op and the path.
func fileErr(op, path string, err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// syncDir makes the rename durable where the OS allows syncing a folder;
// failure is ignored because the file itself is already complete.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}

// rawEntry is one tensor's header entry as decoded, before validation.
// Pointers and nil slices tell a missing field from a zero one.
type rawEntry struct {
	DType   *string `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// entry is a validated header entry with its absolute position resolved.
type entry struct {
	name       string
	dtype      string
	shape      []int
	begin, end int64
}

// parseHeader decodes the header object token by token, because decoding
// into a map would silently keep only the last of two duplicate names.
func parseHeader(header []byte) ([]entry, map[string]string, error) {
	if !utf8.Valid(header) {
		return nil, nil, fmt.Errorf("header is not valid UTF-8: %w", ErrHeader)
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("header: %w: %w", jsonerr.Decode(header, err), ErrHeader)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, fmt.Errorf("header starts with %v, want a JSON object: %w", tok, ErrHeader)
	}
	var (
		entries  []entry
		metadata map[string]string
		seen     = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header: %w: %w", jsonerr.Decode(header, err), ErrHeader)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("header key %v is not a string: %w", tok, ErrHeader)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("header lists %q twice: %w", name, ErrDuplicate)
		}
		seen[name] = true
		if name == metadataKey {
			if err := dec.Decode(&metadata); err != nil {
				return nil, nil, fmt.Errorf("%s must map strings to strings (%w): %w", metadataKey, jsonerr.Decode(header, err), ErrHeader)
			}
			continue
		}
		var raw rawEntry
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: entry is not {dtype, shape, data_offsets} (%w): %w", name, jsonerr.Decode(header, err), ErrHeader)
		}
		e, err := checkEntry(name, raw)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, nil, fmt.Errorf("header: %w: %w", jsonerr.Decode(header, err), ErrHeader)
	}
	if tok, err := dec.Token(); err != io.EOF {
		return nil, nil, fmt.Errorf("header has trailing content after the object (%v): %w", tok, ErrHeader)
	}
	return entries, metadata, nil
}

// checkEntry validates one entry on its own: fields present, dtype known,
// shape sane, and the byte range matching shape and dtype.
func checkEntry(name string, raw rawEntry) (entry, error) {
	switch {
	case raw.DType == nil:
		return entry{}, fmt.Errorf("tensor %q: missing dtype: %w", name, ErrHeader)
	case raw.Shape == nil:
		return entry{}, fmt.Errorf("tensor %q: missing shape: %w", name, ErrHeader)
	case len(raw.Offsets) != 2:
		return entry{}, fmt.Errorf("tensor %q: data_offsets has %d values, want [begin, end]: %w", name, len(raw.Offsets), ErrOffsets)
	}
	size, ok := dtypeSizes[*raw.DType]
	if !ok {
		return entry{}, fmt.Errorf("tensor %q: dtype %q is not one of %s: %w", name, *raw.DType, knownDTypes(), ErrDType)
	}
	shape := make([]int, len(raw.Shape))
	for i, d := range raw.Shape {
		if d < 0 || d > math.MaxInt {
			return entry{}, fmt.Errorf("tensor %q: dimension %d is %d: %w", name, i, d, ErrShape)
		}
		shape[i] = int(d)
	}
	want, err := byteSize(shape, size)
	if err != nil {
		return entry{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	begin, end := raw.Offsets[0], raw.Offsets[1]
	if begin < 0 || end < begin {
		return entry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] are not an increasing range: %w", name, begin, end, ErrOffsets)
	}
	if end-begin != want {
		return entry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] hold %d bytes, but shape %v of %s needs %d: %w",
			name, begin, end, end-begin, shape, *raw.DType, want, ErrDataSize)
	}
	return entry{name: name, dtype: *raw.DType, shape: shape, begin: begin, end: end}, nil
}

// checkLayout enforces that the tensors tile the data section exactly:
// no overlap, no gap, nothing past the end and nothing left over.
func checkLayout(entries []entry, dataLen int64) error {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b entry) int {
		if a.begin != b.begin {
			if a.begin < b.begin {
				return -1
			}
			return 1
		}
		if a.end != b.end {
			if a.end < b.end {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	var pos int64
	prev := ""
	for _, e := range sorted {
		switch {
		case e.end > dataLen:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the %d-byte data section: %w", e.name, e.begin, e.end, dataLen, ErrOffsets)
		case e.begin < pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q, which ends at %d: %w", e.name, e.begin, e.end, prev, pos, ErrOffsets)
		case e.begin > pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a gap after byte %d: %w", e.name, e.begin, e.end, pos, ErrOffsets)
		}
		pos, prev = e.end, e.name
	}
	if pos != dataLen {
		return fmt.Errorf("tensors cover %d bytes but the data section has %d: %w", pos, dataLen, ErrOffsets)
	}
	return nil
}

// Read decodes a safetensors file of the given size. The whole header is
// validated before any tensor data is read, so a corrupt file costs no
// large allocation. Tensors come back in name order; metadata is nil when
// the file has none.
func Read(r io.ReaderAt, size int64) ([]Tensor, map[string]string, error) {
	tensors, metadata, err := read(r, size)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	return tensors, metadata, nil
}

// readFullAt reads len(buf) bytes at off; io.ReaderAt may report io.EOF
// together with a full read at the end of the input, which is success.
func readFullAt(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func read(r io.ReaderAt, size int64) ([]Tensor, map[string]string, error) {
	entries, metadata, dataStart, err := index(r, size)
	if err != nil {
		return nil, nil, err
	}
	tensors := make([]Tensor, len(entries))
	for i, e := range entries {
		data := make([]byte, e.end-e.begin)
		if err := readFullAt(r, data, dataStart+e.begin); err != nil {
			return nil, nil, fmt.Errorf("read tensor %q: %w", e.name, err)
		}
		tensors[i] = Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: data}
	}
	return tensors, metadata, nil
}

// index reads and validates a file's header: its entries in name order,
// its metadata and where the data section starts.
func index(r io.ReaderAt, size int64) ([]entry, map[string]string, int64, error) {
	if size < 8 {
		return nil, nil, 0, fmt.Errorf("file is %d bytes, too short for the 8-byte header length: %w", size, ErrHeaderLength)
	}
	var prefix [8]byte
	if err := readFullAt(r, prefix[:], 0); err != nil {
		return nil, nil, 0, fmt.Errorf("read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > uint64(size-8) {
		what := "the file is truncated, or not safetensors"
		if printable(prefix[:]) {
			// A safetensors file starts with a little-endian length, not
			// text: a .gir, a JSON or a script named as weights.
			what = fmt.Sprintf("the file starts with text (%q), so it is not safetensors", prefix[:])
		}
		return nil, nil, 0, fmt.Errorf("header length %d runs past the end of the %d-byte file (%s): %w", n, size, what, ErrHeaderLength)
	}
	if n > MaxHeaderLength {
		return nil, nil, 0, fmt.Errorf("header length %d exceeds the %d-byte limit: %w", n, MaxHeaderLength, ErrHeaderLength)
	}
	header := make([]byte, n)
	if err := readFullAt(r, header, 8); err != nil {
		return nil, nil, 0, fmt.Errorf("read header: %w", err)
	}
	entries, metadata, err := parseHeader(header)
	if err != nil {
		return nil, nil, 0, err
	}
	dataStart := 8 + int64(n)
	if err := checkLayout(entries, size-dataStart); err != nil {
		return nil, nil, 0, err
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	return entries, metadata, dataStart, nil
}

// File is an open safetensors file whose header has been validated;
// tensors are read one at a time, so a reader holds only what it uses.
type File struct {
	f         *os.File
	path      string
	entries   map[string]entry
	dataStart int64
	// Metadata is the header's __metadata__ (nil when absent).
	Metadata map[string]string
}

// Open opens the safetensors file at path and validates its header.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("not a regular file (mode %v)", fi.Mode())
	}
	var entries []entry
	var meta map[string]string
	var start int64
	if err == nil {
		entries, meta, start, err = index(f, fi.Size())
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint: load %s: %w", path, err)
	}
	file := &File{f: f, path: path, entries: map[string]entry{}, dataStart: start, Metadata: meta}
	for _, e := range entries {
		file.entries[e.name] = e
	}
	return file, nil
}

// Tensor reads the named tensor.
func (f *File) Tensor(name string) (Tensor, error) {
	e, ok := f.entries[name]
	if !ok {
		return Tensor{}, fmt.Errorf("checkpoint: %s has no tensor %q", f.path, name)
	}
	data := make([]byte, e.end-e.begin)
	if err := readFullAt(f.f, data, f.dataStart+e.begin); err != nil {
		return Tensor{}, fmt.Errorf("checkpoint: %s: read tensor %q: %w", f.path, name, err)
	}
	return Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: data}, nil
}

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }

// Load reads the safetensors file at path; see Read.
func Load(path string) ([]Tensor, map[string]string, error) {
	tensors, metadata, err := load(path)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: load %s: %w", path, err)
	}
	return tensors, metadata, nil
}

func load(path string) ([]Tensor, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("not a regular file (mode %v)", fi.Mode())
	}
	return read(f, fi.Size())
}

// Float32Bytes encodes x as little-endian F32 data for a Tensor. It always
// copies, so the tensor does not alias live weights that training keeps
// updating.
func Float32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// BytesFloat32 decodes little-endian F32 tensor data into a fresh slice,
// independent of the host byte order. Trailing bytes that do not fill a
// whole float (len(b)%4) are ignored; Read never produces them for an F32
// tensor.
func BytesFloat32(b []byte) []float32 {
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// printable reports whether b is all printable ASCII or whitespace.
func printable(b []byte) bool {
	for _, c := range b {
		if (c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}
