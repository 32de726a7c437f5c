package ir

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"sort"
	"strconv"
	"strings"
)

// FormatVersion is the first line of every .gir file.
const FormatVersion = "gir 1"

// Print renders m in the .gir text form. It never fails on malformed IR
// (a missing arg prints as %?), so a broken pass's output can still be read.
func Print(m *Module) string { return printModule(m, true) }

// Fingerprint is a hex SHA-256 of the module's text without source
// positions: the same for the same model at the same sizes, whatever file
// or line it was written at. Taken before any pass, it identifies a model
// under every plan (a checkpoint records it).
func (m *Module) Fingerprint() string {
	sum := hashModule(m, false)
	return hex.EncodeToString(sum[:])
}

// PrintHash is the SHA-256 of Print(m), computed as the text is written
// rather than of the whole text at once: a module of thousands of layers
// prints tens of megabytes, which the hash need not hold (passes.Run takes
// one after every pass to tell changed from unchanged).
func PrintHash(m *Module) [32]byte { return hashModule(m, true) }

func hashModule(m *Module, pos bool) [32]byte {
	h := sha256.New()
	w := bufio.NewWriterSize(h, 64<<10)
	writeModule(w, m, pos)
	w.Flush() // a hash's Write never fails
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// ForwardFingerprint is the Fingerprint of the part of the module its
// logits (the first operand of each cross_entropy) depend on, its values
// numbered afresh in order. Two builds of a model whose losses differ
// only in what they add to the cross-entropy (a MoE's auxiliary weight)
// compute the same logits from the same params: their ForwardFingerprints
// are equal where their Fingerprints are not, so weights trained with one
// evaluate and generate with the other. A module without a cross_entropy
// gives its Fingerprint.
func (m *Module) ForwardFingerprint() string {
	var logits []*Value
	for _, v := range m.Values {
		if v.Op == "cross_entropy" && len(v.Args) > 0 && v.Args[0] != nil {
			logits = append(logits, v.Args[0])
		}
	}
	if len(logits) == 0 {
		return m.Fingerprint()
	}
	fwd := &Module{Name: m.Name, Mesh: m.Mesh, IgnoreOnLoad: m.IgnoreOnLoad, EvalDiffers: m.EvalDiffers, Values: m.Values}
	for i, l := range logits {
		fwd.Outputs = append(fwd.Outputs, Output{Name: "logits" + strconv.Itoa(i), Value: l})
	}
	live := fwd.Live()
	fwd.Values = nil
	renamed := make(map[*Value]*Value, len(live))
	for _, v := range m.Values {
		if !live[v] {
			continue
		}
		c := *v
		c.ID = len(fwd.Values)
		c.Args = make([]*Value, len(v.Args))
		for i, a := range v.Args {
			c.Args[i] = renamed[a] // nil, printed %?, only for a broken module
		}
		renamed[v] = &c
		fwd.Values = append(fwd.Values, &c)
	}
	for i := range fwd.Outputs {
		fwd.Outputs[i].Value = renamed[fwd.Outputs[i].Value]
	}
	return fwd.Fingerprint()
}

func printModule(m *Module, pos bool) string {
	var b strings.Builder
	writeModule(&b, m, pos)
	return b.String()
}

// textWriter is what the module's text is written to: a strings.Builder,
// or a bufio.Writer in front of a hash or a file.
type textWriter interface {
	io.StringWriter
	io.ByteWriter
}

func writeModule(b textWriter, m *Module, pos bool) {
	b.WriteString(FormatVersion + "\n")
	b.WriteString("module " + strconv.Quote(m.Name) + "\n")
	if len(m.Passes) > 0 {
		b.WriteString("passes " + strings.Join(m.Passes, ",") + "\n")
	}
	if m.Mesh != nil {
		b.WriteString("mesh " + m.Mesh.String() + "\n")
	}
	for _, p := range m.IgnoreOnLoad {
		b.WriteString("ignore-on-load " + strconv.Quote(p) + "\n")
	}
	if m.EvalDiffers {
		b.WriteString("evaluation-differs\n")
	}
	if m.ExportConfig != "" && pos {
		// pos: printed, not fingerprinted (Module.ExportConfig).
		b.WriteString("export-config " + strconv.Quote(m.ExportConfig) + "\n")
	}
	for _, v := range m.Values {
		writeValue(b, v, pos)
		b.WriteByte('\n')
	}
	for _, o := range m.Outputs {
		b.WriteString("output " + strconv.Quote(o.Name) + " = " + ref(o.Value) + "\n")
	}
	for _, u := range m.Updates {
		b.WriteString("update " + ref(u.State) + " = " + ref(u.Value) + "\n")
	}
}

// Fprint writes Print(m) to w.
func Fprint(w io.Writer, m *Module) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	writeModule(bw, m, true)
	return bw.Flush() // the first error of any write
}

func ref(v *Value) string {
	if v == nil {
		return "%?"
	}
	return v.Ref()
}

// FormatValue renders one value line:
// %12 = matmul %10, %3 : f32[4,128] {transB=true layer=3 phase=fwd} @model.go:41
func FormatValue(v *Value) string { return formatValue(v, true) }

func formatValue(v *Value, pos bool) string {
	var b strings.Builder
	writeValue(&b, v, pos)
	return b.String()
}

func writeValue(b textWriter, v *Value, pos bool) {
	// Piece by piece: a concatenation passed to b (an interface) would be
	// allocated on the heap.
	b.WriteString(v.Ref())
	b.WriteString(" = ")
	b.WriteString(v.Op)
	for i, a := range v.Args {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte(' ')
		b.WriteString(ref(a))
	}
	b.WriteString(" : ")
	b.WriteString(v.Type.String())
	keys := make([]string, 0, len(v.Attrs))
	for k := range v.Attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// The attributes are written as they go: a constant's data is one
	// string of megabytes, which a field built by concatenation copied
	// three times on every print, and every pass hashes the module.
	braced := false
	open := func() {
		if braced {
			b.WriteByte(' ')
			return
		}
		b.WriteString(" {")
		braced = true
	}
	for _, k := range keys {
		open()
		b.WriteString(k)
		b.WriteByte('=')
		if x, ok := v.Attrs[k].(string); ok && plainASCII(x) {
			// strconv.Quote's own result for such a string, uncopied.
			b.WriteByte('"')
			b.WriteString(x)
			b.WriteByte('"')
		} else {
			b.WriteString(formatAttr(v.Attrs[k]))
		}
	}
	var fields []string
	if v.Place != nil {
		ps := make([]string, len(v.Place))
		for i, p := range v.Place {
			ps[i] = p.String()
		}
		fields = append(fields, "place=["+strings.Join(ps, ",")+"]")
	}
	if v.Meta.Layer >= 0 {
		fields = append(fields, "layer="+strconv.Itoa(v.Meta.Layer))
	}
	if v.Meta.Stage >= 0 {
		fields = append(fields, "stage="+strconv.Itoa(v.Meta.Stage))
	}
	if v.Meta.Chunk >= 0 {
		fields = append(fields, "chunk="+strconv.Itoa(v.Meta.Chunk))
	}
	if v.Meta.Micro >= 0 {
		fields = append(fields, "micro="+strconv.Itoa(v.Meta.Micro))
	}
	if v.Meta.Phase != PhaseNone {
		fields = append(fields, "phase="+v.Meta.Phase.String())
	}
	if v.Meta.Selective {
		fields = append(fields, "selective=true")
	}
	if v.Meta.Precision != Invalid {
		fields = append(fields, "precision="+v.Meta.Precision.String())
	}
	for _, f := range fields {
		open()
		b.WriteString(f)
	}
	if braced {
		b.WriteByte('}')
	}
	if pos && v.Pos.IsKnown() {
		b.WriteString(" @")
		b.WriteString(v.Pos.String())
	}
}

// plainASCII says strconv.Quote would only put quotes around s: printable
// ASCII without a quote or a backslash.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func formatAttr(a any) string {
	switch x := a.(type) {
	case int:
		return strconv.Itoa(x)
	case []int:
		return Shape(x).String()
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	}
	return "?"
}
