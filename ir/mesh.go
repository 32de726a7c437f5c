package ir

import (
	"fmt"
	"strconv"
	"strings"
)

// MeshAxis is one named axis of the device mesh.
type MeshAxis struct {
	Name string
	Size int
}

// Mesh is the logical arrangement of devices: the product of the axis sizes
// is the device count. Axis names are dp, pp, tp and ep by convention.
type Mesh struct {
	Axes []MeshAxis
}

// Devices is the number of devices the mesh spans.
func (m *Mesh) Devices() int {
	n := 1
	for _, a := range m.Axes {
		n *= a.Size
	}
	return n
}

// Axis returns the index of the named axis, or -1.
func (m *Mesh) Axis(name string) int {
	for i, a := range m.Axes {
		if a.Name == name {
			return i
		}
	}
	return -1
}

func (m *Mesh) String() string {
	parts := make([]string, len(m.Axes))
	for i, a := range m.Axes {
		parts[i] = a.Name + "=" + strconv.Itoa(a.Size)
	}
	return strings.Join(parts, ",")
}

// ParseMesh reads "dp=2,tp=4".
func ParseMesh(s string) (*Mesh, error) {
	m := &Mesh{}
	for _, f := range strings.Split(s, ",") {
		name, size, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(size)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("bad mesh axis %q: want name=size", f)
		}
		if n < 1 {
			return nil, fmt.Errorf("bad mesh axis %q: size must be at least 1", f)
		}
		m.Axes = append(m.Axes, MeshAxis{Name: name, Size: n})
	}
	return m, nil
}

// PlacementKind says how a value is laid out along one mesh axis.
type PlacementKind uint8

// The placement kinds of DTensor/GSPMD.
const (
	Replicate PlacementKind = iota // every device on the axis holds all of it
	Shard                          // devices hold equal slices along Dim
	Partial                        // devices hold addends of the value
)

// Placement is a value's layout along one mesh axis.
type Placement struct {
	Kind PlacementKind
	Dim  int // tensor dim for Shard
	// Blocks > 1 shards a fused dim: the dim is Blocks equal blocks laid
	// end to end (q, k and v of a fused projection) and each block is split
	// across the axis, so a device holds its slice of every block. Printed
	// S(d)xBlocks. 0 and 1 both mean one block.
	Blocks int
}

// NumBlocks is Blocks with 0 read as 1.
func (p Placement) NumBlocks() int { return max(p.Blocks, 1) }

// Equal compares placements, reading Blocks 0 and 1 alike.
func (p Placement) Equal(q Placement) bool {
	return p.Kind == q.Kind && (p.Kind != Shard || p.Dim == q.Dim && p.NumBlocks() == q.NumBlocks())
}

func (p Placement) String() string {
	switch p.Kind {
	case Replicate:
		return "R"
	case Partial:
		return "P"
	default:
		s := "S(" + strconv.Itoa(p.Dim) + ")"
		if p.NumBlocks() > 1 {
			s += "x" + strconv.Itoa(p.Blocks)
		}
		return s
	}
}

// ParsePlacement reads R, P or S(d).
func ParsePlacement(s string) (Placement, error) {
	switch {
	case s == "R":
		return Placement{Kind: Replicate}, nil
	case s == "P":
		return Placement{Kind: Partial}, nil
	case strings.HasPrefix(s, "S("):
		body, blocks, hasBlocks := strings.Cut(s[2:], ")x")
		if !hasBlocks {
			if !strings.HasSuffix(body, ")") {
				break
			}
			body = body[:len(body)-1]
		}
		d, err := strconv.Atoi(body)
		if err != nil { // a negative dim parses; the verifier names it
			return Placement{}, fmt.Errorf("bad shard dim in placement %q", s)
		}
		p := Placement{Kind: Shard, Dim: d}
		if hasBlocks {
			if p.Blocks, err = strconv.Atoi(blocks); err != nil || p.Blocks < 2 {
				return Placement{}, fmt.Errorf("bad block count in placement %q: want S(d)xK with K ≥ 2", s)
			}
		}
		return p, nil
	}
	return Placement{}, fmt.Errorf("bad placement %q: want R, P or S(dim)", s)
}

// Placed reports whether p shards dim d.
func (p Placement) Placed(d int) bool { return p.Kind == Shard && p.Dim == d }

// Replicated is the placement of a value held whole on every device.
func Replicated(m *Mesh) []Placement {
	if m == nil {
		return nil
	}
	return make([]Placement, len(m.Axes))
}

// LocalShape is the shape one device holds of a value of global shape s
// placed by place on mesh m: every sharded dim divided by its axis size.
func LocalShape(s Shape, place []Placement, m *Mesh) Shape {
	out := s.Clone()
	if m == nil {
		return out
	}
	for i, p := range place {
		if p.Kind == Shard && p.Dim < len(out) && i < len(m.Axes) && m.Axes[i].Size > 0 {
			out[p.Dim] /= m.Axes[i].Size
		}
	}
	return out
}

// PlacementString prints a placement list as in dumps: [R,S(0)].
func PlacementString(place []Placement) string {
	parts := make([]string, len(place))
	for i, p := range place {
		parts[i] = p.String()
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// SamePlacement reports whether two placement lists are equal.
func SamePlacement(a, b []Placement) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}
