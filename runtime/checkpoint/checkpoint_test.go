package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sampleTensors covers every dtype, a scalar and an empty tensor, listed
// out of name order on purpose.
func sampleTensors() []Tensor {
	return []Tensor{
		{Name: "z.f32", DType: "F32", Shape: []int{2, 3}, Data: Float32Bytes([]float32{1, -2, 3.5, 0, float32(math.Inf(1)), -0.25})},
		{Name: "f64", DType: "F64", Shape: []int{2}, Data: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, math.Float64bits(math.Pi)), math.Float64bits(-1))},
		{Name: "f16", DType: "F16", Shape: []int{3}, Data: []byte{0x00, 0x3c, 0x00, 0xc0, 0x00, 0x00}},
		{Name: "bf16", DType: "BF16", Shape: []int{1, 2}, Data: []byte{0x80, 0x3f, 0x00, 0x40}},
		{Name: "i32", DType: "I32", Shape: []int{4}, Data: []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 3, 0, 0, 0}},
		{Name: "i64", DType: "I64", Shape: []int{1}, Data: []byte{9, 8, 7, 6, 5, 4, 3, 2}},
		{Name: "mask", DType: "BOOL", Shape: []int{3}, Data: []byte{1, 0, 1}},
		{Name: "scalar", DType: "U8", Shape: []int{}, Data: []byte{42}},
		{Name: "empty", DType: "F32", Shape: []int{0, 5}, Data: []byte{}},
		{Name: "a<b&c", DType: "U8", Shape: []int{1}, Data: []byte{7}},
	}
}

func sortedByName(ts []Tensor) []Tensor {
	out := slices.Clone(ts)
	slices.SortFunc(out, func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		tensors  []Tensor
		metadata map[string]string
	}{
		{"all dtypes with metadata", sampleTensors(), map[string]string{"format": "pt", "step": "100", "note": "quotes \" and \\ and é"}},
		{"no metadata", sampleTensors()[:3], nil},
		{"only an empty tensor", []Tensor{{Name: "e", DType: "I64", Shape: []int{0}, Data: []byte{}}}, map[string]string{"k": "v"}},
		{"no tensors", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			mustNoErr(t, Write(&buf, tt.tensors, tt.metadata))
			raw := buf.Bytes()
			n := binary.LittleEndian.Uint64(raw)
			expectEqual(t, uint64(0), (8+n)%8, "data section offset mod 8")
			h := bytes.TrimRight(raw[8:8+n], " ")
			expect(t, len(h) > 0 && h[len(h)-1] == '}', "header %q should end with } before the padding", h)

			got, meta, err := Read(bytes.NewReader(raw), int64(len(raw)))
			mustNoErr(t, err)
			checkTensors(t, sortedByName(tt.tensors), got)
			if len(tt.metadata) == 0 {
				expect(t, meta == nil, "metadata = %v, want nil", meta)
			} else {
				expectEqual(t, tt.metadata, meta, "metadata")
			}

			path := filepath.Join(t.TempDir(), "model.safetensors")
			mustNoErr(t, Save(path, tt.tensors, tt.metadata))
			onDisk, err := os.ReadFile(path)
			mustNoErr(t, err)
			expect(t, bytes.Equal(raw, onDisk), "Save wrote different bytes than Write")
			got, _, err = Load(path)
			mustNoErr(t, err)
			checkTensors(t, sortedByName(tt.tensors), got)
		})
	}
}

func checkTensors(t *testing.T, want, got []Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d tensors, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		expectEqual(t, w.Name, g.Name, "name")
		expectEqual(t, w.DType, g.DType, w.Name+" dtype")
		expect(t, len(g.Shape) == len(w.Shape) && slices.Equal(w.Shape, g.Shape), "%s shape = %v, want %v", w.Name, g.Shape, w.Shape)
		expect(t, bytes.Equal(w.Data, g.Data), "%s data = %v, want %v", w.Name, g.Data, w.Data)
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	forward := sampleTensors()
	backward := sampleTensors()
	for i, j := 0, len(backward)-1; i < j; i, j = i+1, j-1 {
		backward[i], backward[j] = backward[j], backward[i]
	}
	meta := map[string]string{"b": "2", "a": "1", "c": "3"}
	var a, b bytes.Buffer
	mustNoErr(t, Write(&a, forward, meta))
	mustNoErr(t, Write(&b, backward, meta))
	expect(t, bytes.Equal(a.Bytes(), b.Bytes()), "input order changed the output bytes")
	expectEqual(t, "z.f32", forward[0].Name, "Write must not reorder the caller's slice")
}

// TestHandComputedFile pins the exact bytes of a tiny file, worked out by
// hand from the format description.
func TestHandComputedFile(t *testing.T) {
	tensors := []Tensor{
		{Name: "b", DType: "I32", Shape: []int{2}, Data: []byte{1, 0, 0, 0, 2, 0, 0, 0}},
		{Name: "a", DType: "U8", Shape: []int{}, Data: []byte{7}},
	}
	// Header: 130 bytes of JSON, padded with 6 spaces to 136 = 0x88 so
	// the data starts at byte 8+136 = 144, a multiple of 8. Tensor "a"
	// comes first (name order) and takes data byte 0; "b" takes 1..8.
	header := `{"__metadata__":{"k":"v"},` +
		`"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},` +
		`"b":{"dtype":"I32","shape":[2],"data_offsets":[1,9]}}` +
		"      "
	want := []byte{0x88, 0, 0, 0, 0, 0, 0, 0}
	want = append(want, header...)
	want = append(want, 7, 1, 0, 0, 0, 2, 0, 0, 0)
	expectEqual(t, 136, len(header), "hand-computed header length")

	var buf bytes.Buffer
	mustNoErr(t, Write(&buf, tensors, map[string]string{"k": "v"}))
	if !bytes.Equal(want, buf.Bytes()) {
		t.Fatalf("file bytes differ\n got: %q\nwant: %q", buf.Bytes(), want)
	}

	got, meta, err := Read(bytes.NewReader(want), int64(len(want)))
	mustNoErr(t, err)
	checkTensors(t, sortedByName(tensors), got)
	expectEqual(t, map[string]string{"k": "v"}, meta, "metadata")
}

// file assembles a safetensors file from a header string and data bytes,
// so corruption tests can write exactly the bytes they mean.
func file(header string, data ...byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func TestReadCorruption(t *testing.T) {
	eight := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40} // F32 1, 2
	longHeader := binary.LittleEndian.AppendUint64(nil, 1000)
	longHeader = append(longHeader, `{}`...)

	tests := []struct {
		name    string
		raw     []byte
		wantIs  error
		wantMsg string
	}{
		{"shorter than length prefix", []byte{1, 2, 3}, ErrHeaderLength, "too short"},
		{"header length beyond file", longHeader, ErrHeaderLength, "runs past the end"},
		{"header length huge", binary.LittleEndian.AppendUint64(nil, math.MaxUint64), ErrHeaderLength, "runs past the end"},
		{"bad JSON", file(`{"a":{"dtype":`), ErrHeader, "the JSON ends before it is complete (is the file cut short?)"},
		{"bad JSON key", file(`{a:1}`), ErrHeader, "not JSON"},
		{"not an object", file(`[1, 2]`), ErrHeader, "want a JSON object"},
		{"trailing content", file(`{} {}`), ErrHeader, "trailing content"},
		{"invalid UTF-8", file("{\"\xff\":1}"), ErrHeader, "UTF-8"},
		{"entry of wrong type", file(`{"a":[1]}`), ErrHeader, `tensor "a"`},
		{"missing dtype", file(`{"a":{"shape":[2],"data_offsets":[0,8]}}`, eight...), ErrHeader, "missing dtype"},
		{"missing shape", file(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, eight...), ErrHeader, "missing shape"},
		{"metadata not strings", file(`{"__metadata__":{"k":1}}`), ErrHeader, "__metadata__"},
		{"unknown dtype", file(`{"a":{"dtype":"F8","shape":[2],"data_offsets":[0,8]}}`, eight...), ErrDType, `"F8"`},
		{"negative dimension", file(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`), ErrShape, "dimension 0 is -1"},
		{"shape overflows", file(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, eight...), ErrShape, "overflows"},
		{"size does not match shape", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight...), ErrDataSize, "needs 12"},
		{"offsets not a pair", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, eight...), ErrOffsets, "want [begin, end]"},
		{"offsets decreasing", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}`, eight...), ErrOffsets, "not an increasing range"},
		{"offsets out of range", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 1, 2, 3, 4), ErrOffsets, "run past"},
		{"overlapping offsets", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight...), ErrOffsets, "overlap"},
		{"gap before first tensor", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight...), ErrOffsets, "gap"},
		{"unclaimed trailing data", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight...), ErrOffsets, "cover 4 bytes"},
		{"duplicate names", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight...), ErrDuplicate, `"a" twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, meta, err := Read(bytes.NewReader(tt.raw), int64(len(tt.raw)))
			expectErr(t, err, tt.wantIs, tt.wantMsg)
			expect(t, got == nil && meta == nil, "got data along with the error")
		})
	}
}

func TestReadAcceptsUnpaddedHeader(t *testing.T) {
	// Other writers need not pad; only the ranges have to be right.
	raw := file(`{"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, 1, 2, 3)
	got, _, err := Read(bytes.NewReader(raw), int64(len(raw)))
	mustNoErr(t, err)
	checkTensors(t, []Tensor{{Name: "x", DType: "U8", Shape: []int{3}, Data: []byte{1, 2, 3}}}, got)
}

func TestWriteValidation(t *testing.T) {
	good := Tensor{Name: "w", DType: "F32", Shape: []int{2}, Data: make([]byte, 8)}
	tests := []struct {
		name    string
		tensors []Tensor
		meta    map[string]string
		wantIs  error
		wantMsg string
	}{
		{"data too short", []Tensor{{Name: "w", DType: "F32", Shape: []int{3}, Data: make([]byte, 8)}}, nil, ErrDataSize, "needs 12"},
		{"scalar with no data", []Tensor{{Name: "s", DType: "I64", Shape: nil, Data: nil}}, nil, ErrDataSize, "needs 8"},
		{"unknown dtype", []Tensor{{Name: "w", DType: "f32", Shape: []int{2}, Data: make([]byte, 8)}}, nil, ErrDType, `"f32"`},
		{"negative dimension", []Tensor{{Name: "w", DType: "U8", Shape: []int{-2}}}, nil, ErrShape, "-2"},
		{"duplicate name", []Tensor{good, good}, nil, ErrDuplicate, `"w"`},
		{"empty name", []Tensor{{DType: "U8", Shape: []int{0}}}, nil, ErrName, "empty name"},
		{"reserved name", []Tensor{{Name: "__metadata__", DType: "U8", Shape: []int{0}}}, nil, ErrName, "reserves"},
		{"name not UTF-8", []Tensor{{Name: "\xff", DType: "U8", Shape: []int{0}}}, nil, ErrName, "UTF-8"},
		{"metadata not UTF-8", []Tensor{good}, map[string]string{"k": "\xfe"}, ErrHeader, "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Write(&buf, tt.tensors, tt.meta)
			expectErr(t, err, tt.wantIs, tt.wantMsg)
			expectEqual(t, 0, buf.Len(), "bytes written before failing")
		})
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

func TestWriteReportsWriterErrors(t *testing.T) {
	for after, wantMsg := range []string{"header length", "write header", "write tensor"} {
		err := Write(&failingWriter{after: after}, sampleTensors(), nil)
		expectErr(t, err, nil, wantMsg, "disk full")
	}
}

// A save named through a symbolic link writes the file the link leads
// to; the link stays a link.
func TestSaveWritesThroughALink(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	link := filepath.Join(dir, "model.safetensors")
	mustNoErr(t, os.Symlink(filepath.Join(other, "weights.safetensors"), link))
	mustNoErr(t, Save(link, sampleTensors(), map[string]string{"step": "1"}))
	fi, err := os.Lstat(link)
	mustNoErr(t, err)
	expect(t, fi.Mode()&os.ModeSymlink != 0, "the link was replaced by a file")
	ts, meta, err := Load(filepath.Join(other, "weights.safetensors"))
	mustNoErr(t, err)
	expectEqual(t, len(sampleTensors()), len(ts), "tensors in the target")
	expectEqual(t, "1", meta["step"], "the target's metadata")
	entries, _ := os.ReadDir(other)
	expectEqual(t, 1, len(entries), "files in the target's folder")
}

func TestSaveIsAtomic(t *testing.T) {
	bad := []Tensor{{Name: "w", DType: "F32", Shape: []int{4}, Data: make([]byte, 3)}}
	good := sampleTensors()

	t.Run("failed save creates nothing", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "new.safetensors")
		err := Save(path, bad, nil)
		expectErr(t, err, ErrDataSize, path)
		_, statErr := os.Stat(path)
		expect(t, errors.Is(statErr, fs.ErrNotExist), "file exists at %s after a failed save", path)
		entries, _ := os.ReadDir(dir)
		expectEqual(t, 0, len(entries), "files left in the folder")
	})

	t.Run("failed save keeps the previous checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "model.safetensors")
		mustNoErr(t, Save(path, good, map[string]string{"step": "1"}))
		before, err := os.ReadFile(path)
		mustNoErr(t, err)
		expectErr(t, Save(path, bad, nil), ErrDataSize, path)
		after, err := os.ReadFile(path)
		mustNoErr(t, err)
		expect(t, bytes.Equal(before, after), "previous checkpoint was changed")
		_, statErr := os.Stat(path + ".tmp")
		expect(t, errors.Is(statErr, fs.ErrNotExist), "temporary file left behind")
	})

	t.Run("overwrite replaces the checkpoint", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "model.safetensors")
		mustNoErr(t, Save(path, good, map[string]string{"step": "1"}))
		mustNoErr(t, Save(path, good[:1], map[string]string{"step": "2"}))
		got, meta, err := Load(path)
		mustNoErr(t, err)
		expectEqual(t, 1, len(got), "tensors after overwrite")
		expectEqual(t, "2", meta["step"], "step after overwrite")
	})

	t.Run("folder missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "no", "such", "dir", "m.safetensors")
		expectErr(t, Save(path, good, nil), fs.ErrNotExist, path)
	})
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.safetensors")
	corrupt := filepath.Join(dir, "corrupt.safetensors")
	mustNoErr(t, os.WriteFile(corrupt, file(`{"a":{"dtype":"Q4","shape":[],"data_offsets":[0,1]}}`, 0), 0o644))
	tests := []struct {
		name   string
		path   string
		wantIs error
	}{
		{"missing file", missing, fs.ErrNotExist},
		{"corrupt file", corrupt, ErrDType},
		{"folder", dir, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Load(tt.path)
			expectErr(t, err, tt.wantIs, tt.path)
		})
	}
}

func TestFloat32Bytes(t *testing.T) {
	x := []float32{1, -2.5, 0, float32(math.Copysign(0, -1)), float32(math.Inf(-1)), math.MaxFloat32, math.SmallestNonzeroFloat32}
	b := Float32Bytes(x)
	expectEqual(t, []byte{0, 0, 0x80, 0x3f}, b[:4], "1.0 as little-endian F32")
	back := BytesFloat32(b)
	if len(back) != len(x) {
		t.Fatalf("got %d floats back, want %d", len(back), len(x))
	}
	for i := range x {
		expect(t, math.Float32bits(back[i]) == math.Float32bits(x[i]), "element %d: %v came back as %v", i, x[i], back[i])
	}
	nan := math.Float32frombits(0x7fc00001)
	expectEqual(t, uint32(0x7fc00001), math.Float32bits(BytesFloat32(Float32Bytes([]float32{nan}))[0]), "NaN payload")

	b[0] = 0xAA
	expectEqual(t, float32(1), x[0], "Float32Bytes must copy")
	expectEqual(t, 1, len(BytesFloat32([]byte{0, 0, 0x80, 0x3f, 9})), "floats from 5 bytes")
	expectEqual(t, 0, len(BytesFloat32(nil)), "floats from nil")
	expectEqual(t, 0, len(Float32Bytes(nil)), "bytes from nil")
}

func TestDTypeSize(t *testing.T) {
	for dtype, want := range map[string]int{"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "BOOL": 1, "U8": 1} {
		got, ok := DTypeSize(dtype)
		expect(t, ok && got == want, "DTypeSize(%s) = %d, %v; want %d", dtype, got, ok, want)
	}
	_, ok := DTypeSize("F8_E4M3")
	expect(t, !ok, "F8_E4M3 should be unsupported")
}

// FuzzRead checks that no input makes Read panic, and that whatever it
// accepts writes back to a file that reads the same.
func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	if err := Write(&buf, sampleTensors(), map[string]string{"k": "v"}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)...))
	f.Add([]byte{})
	f.Add(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}`, 1, 2, 3, 4))
	f.Fuzz(func(t *testing.T, raw []byte) {
		tensors, meta, err := Read(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := Write(&out, tensors, meta); err != nil {
			if strings.Contains(err.Error(), "empty name") {
				return // Read accepts "" as a name; Write refuses it
			}
			t.Fatalf("Read accepted a file Write rejects: %v", err)
		}
		again, _, err := Read(bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		checkTensors(t, tensors, again)
	})
}
