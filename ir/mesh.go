package ir

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MeshAxis is one named axis of the device mesh.
type MeshAxis struct {
	Name string
	Size int
	// Zigzag changes how the axis splits a dim: into 2·Size equal
	// chunks, device i holding chunks i and 2·Size−1−i in that order,
	// where a plain split gives device i the i-th of Size. A sequence
	// split so over a context-parallel axis gives every device the same
	// share of a causal attention's work (Megatron-Core's load balance).
	// Printed cp=4:zigzag.
	Zigzag bool
	// Outer makes a sequence axis split a dim it shares with the weight
	// axes before they do: on the sequence dim under sequence
	// parallelism, each cp rank's chunk is split over tp, as Megatron-Core
	// lays it out, so sp's collectives over tp move one cp rank's tokens
	// and nothing crosses cp around them. Without it tp is the coarser
	// split everywhere (SplitOrder), which Ulysses' exchange of sequence
	// for heads needs: its heads are split over cp inside each tp block.
	// Printed cp=4:outer.
	Outer bool
}

// ZigzagChunk is the chunk of the whole dim (of 2·n) that sits k-th in
// the order a zigzag axis of n devices holds them: device k/2's first
// (k even) or second chunk.
func ZigzagChunk(k, n int) int {
	if k%2 == 0 {
		return k / 2
	}
	return 2*n - 1 - k/2
}

// AxisRole is what a mesh axis parallelises, which is what passes ask
// for: the axis a batch is split over, the one weights are split over,
// the one pipeline stages sit on.
type AxisRole uint8

// The roles of mesh axes.
const (
	RoleUnknown AxisRole = iota
	// RoleBatch axes split the batch's rows: data parallelism (dp), and
	// expert parallelism (ep), whose ranks also hold different experts.
	RoleBatch
	// RoleWeight axes split weights and the activations between them:
	// tensor parallelism (tp).
	RoleWeight
	// RolePipeline axes hold different layers: pipeline parallelism (pp).
	RolePipeline
	// RoleSequence axes split every activation's sequence dim through the
	// whole block, attention included: context parallelism (cp). Weights
	// are whole on it, and their gradients are summed over it as over dp.
	RoleSequence
)

func (r AxisRole) String() string {
	switch r {
	case RoleBatch:
		return "batch"
	case RoleWeight:
		return "weight"
	case RolePipeline:
		return "pipeline"
	case RoleSequence:
		return "sequence"
	}
	return "unknown"
}

// axisRoles gives each conventional axis name its role.
var axisRoles = map[string]AxisRole{"dp": RoleBatch, "ep": RoleBatch, "tp": RoleWeight, "pp": RolePipeline, "cp": RoleSequence}

// Role is the axis's role, from its conventional name (dp, ep: batch; tp:
// weight; pp: pipeline; cp: sequence); any other name has no role.
func (a MeshAxis) Role() AxisRole { return axisRoles[a.Name] }

// Mesh is the logical arrangement of devices: the product of the axis sizes
// is the device count. Axis names are dp, pp, tp and ep by convention, and
// the name gives the axis its role (MeshAxis.Role).
type Mesh struct {
	Axes []MeshAxis
}

// AxisFor returns the index of the first axis with the role, or -1. A nil
// mesh has none.
func (m *Mesh) AxisFor(r AxisRole) int {
	if m == nil {
		return -1
	}
	for i, a := range m.Axes {
		if a.Role() == r {
			return i
		}
	}
	return -1
}

// DataAxis is the data-parallel axis (dp: the batch axis that holds whole
// replicas), or -1; an expert axis (ep) is a batch axis too but not this.
func (m *Mesh) DataAxis() int { return m.Axis("dp") }

// ExpertAxis is the expert-parallel axis (ep: a batch axis over which
// mixture-of-experts weights are split by expert), or -1.
func (m *Mesh) ExpertAxis() int { return m.Axis("ep") }

// WeightAxis is the tensor-parallel axis (role weight), or -1.
func (m *Mesh) WeightAxis() int { return m.AxisFor(RoleWeight) }

// PipelineAxis is the pipeline axis (role pipeline), or -1.
func (m *Mesh) PipelineAxis() int { return m.AxisFor(RolePipeline) }

// SequenceAxis is the context-parallel axis (role sequence), or -1.
func (m *Mesh) SequenceAxis() int { return m.AxisFor(RoleSequence) }

// SizeOf is the size of axis i, or 1 when i is -1 (no such axis).
func (m *Mesh) SizeOf(i int) int {
	if m == nil || i < 0 {
		return 1
	}
	return m.Axes[i].Size
}

// DeviceCount is Devices, or an error when the product of the axis sizes
// does not fit in an int (Devices would wrap): meshes read from text or
// flags are checked with it.
func (m *Mesh) DeviceCount() (int, error) {
	n := int64(1)
	for _, a := range m.Axes {
		var ok bool
		if n, ok = MulInt64(n, int64(a.Size)); !ok || n > math.MaxInt {
			return 0, fmt.Errorf("mesh %v spans more devices than an int holds", m)
		}
	}
	return int(n), nil
}

// Devices is the number of devices the mesh spans.
func (m *Mesh) Devices() int {
	n := 1
	for _, a := range m.Axes {
		n *= a.Size
	}
	return n
}

// Axis returns the index of the named axis, or -1 (a nil mesh has none).
func (m *Mesh) Axis(name string) int {
	if m == nil {
		return -1
	}
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
		if a.Zigzag {
			parts[i] += ":zigzag"
		}
		if a.Outer {
			parts[i] += ":outer"
		}
	}
	return strings.Join(parts, ",")
}

// ParseMesh reads "dp=2,tp=4" (an axis's size may be followed by
// :zigzag and :outer, in either order).
func ParseMesh(s string) (*Mesh, error) {
	m := &Mesh{}
	for _, f := range strings.Split(s, ",") {
		name, rest, ok := strings.Cut(f, "=")
		size, flags, flagged := strings.Cut(rest, ":")
		var zigzag, outer bool
		if flagged {
			for _, fl := range strings.Split(flags, ":") {
				switch {
				case fl == "zigzag" && !zigzag:
					zigzag = true
				case fl == "outer" && !outer:
					outer = true
				default:
					return nil, fmt.Errorf("bad mesh axis %q: %q is not a layout (want zigzag or outer, each at most once)", f, fl)
				}
			}
		}
		n, err := strconv.Atoi(size)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("bad mesh axis %q: want name=size", f)
		}
		if n < 1 {
			return nil, fmt.Errorf("bad mesh axis %q: size must be at least 1", f)
		}
		a := MeshAxis{Name: name, Size: n, Zigzag: zigzag, Outer: outer}
		if outer && a.Role() != RoleSequence {
			return nil, fmt.Errorf("bad mesh axis %q: only a sequence axis (cp) can split before the weight axes (:outer)", f)
		}
		m.Axes = append(m.Axes, a)
		if _, err := m.DeviceCount(); err != nil {
			return nil, err
		}
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

// Coords is the position of device rank on each axis. The last axis varies
// fastest, so neighbouring ranks share every axis but the last (Megatron's
// layout: tensor-parallel ranks adjacent, pipeline stages outermost).
func (m *Mesh) Coords(rank int) []int {
	c := make([]int, len(m.Axes))
	for i := len(m.Axes) - 1; i >= 0; i-- {
		c[i] = rank % m.Axes[i].Size
		rank /= m.Axes[i].Size
	}
	return c
}

// Rank is the inverse of Coords.
func (m *Mesh) Rank(coords []int) int {
	r := 0
	for i, a := range m.Axes {
		r = r*a.Size + coords[i]
	}
	return r
}

// AxisRanks is the line of devices through coords along axis ax, ordered
// by their coordinate on it: the members of a collective over ax.
func (m *Mesh) AxisRanks(coords []int, ax int) []int {
	c := append([]int(nil), coords...)
	ranks := make([]int, m.Axes[ax].Size)
	for i := range ranks {
		c[ax] = i
		ranks[i] = m.Rank(c)
	}
	return ranks
}

// Box is the part of a placed tensor one device holds, in a view of the
// global shape where every dim split into k fused blocks (Placement.Blocks)
// is two dims, (k, size/k): in that view the device's part is one box whose
// row-major order is the device's buffer.
type Box struct {
	Shape    Shape // the view of the global shape
	Lo, Size []int // the box's corner and extent in the view
}

// SplitOrder lists the axes in the order they split a dim several of them
// split, coarsest first: weight axes (tp), then the others in mesh order
// (dp before ep). Weight axes come first whatever the mesh order because a
// tensor-parallel block is what a device computes with: ZeRO splitting a
// tp-split vector over dp splits inside each tp block, so gathering over
// dp gives back the tp block.
func (m *Mesh) SplitOrder() []int { return m.splitOrder(true) }

// splitOrder lists the weight axes, then the others in mesh order
// (weightsFirst), or the others first and the weight axes last.
func (m *Mesh) splitOrder(weightsFirst bool) []int {
	var order []int
	for _, weights := range []bool{weightsFirst, !weightsFirst} {
		for i, a := range m.Axes {
			if (a.Role() == RoleWeight) == weights {
				order = append(order, i)
			}
		}
	}
	return order
}

// SplitOrderOn is the order in which the axes split dim d of a value
// placed by any of places: SplitOrder, except on a dim an outer sequence
// axis (MeshAxis.Outer) splits, where the axes go in mesh order, the
// weight axes last: the batch axes take whole sequences, the sequence
// axis its chunk of each, and the weight axes split that chunk. Passing
// both sides of a conversion gives one order for both.
func (m *Mesh) SplitOrderOn(d int, places ...[]Placement) []int {
	for i, a := range m.Axes {
		if !a.Outer || a.Size == 1 {
			continue
		}
		for _, place := range places {
			if i < len(place) && place[i].Kind == Shard && place[i].Dim == d {
				return m.splitOrder(false)
			}
		}
	}
	return m.SplitOrder()
}

// InnerSplit reports whether an axis later than ax in SplitOrderOn splits
// place's dim d: a collective over ax on dim d would then not join or
// split contiguous parts.
func (m *Mesh) InnerSplit(place []Placement, ax, d int) bool {
	seen := false
	for _, i := range m.SplitOrderOn(d, place) {
		if i == ax {
			seen = true
			continue
		}
		if seen && i < len(place) && place[i].Kind == Shard && place[i].Dim == d && m.Axes[i].Size > 1 {
			return true
		}
	}
	return false
}

// BlockBox is the box the device at coords holds of a tensor of global
// shape placed by place on m. A dim split by several axes is split in
// SplitOrderOn: the first splitting axis picks the coarsest part, so the
// device's index along the dim is its coordinates on those axes read as
// digits. A dim split in blocks (S(d)xK) is viewed as [K, n/K]: the axis
// that splits it in blocks, and any later in SplitOrderOn, split inside
// each block; an earlier axis splits the blocks themselves. That is how a
// sequence split over cp reads after [batch, seq] is merged into one dim
// of batch·seq rows: each sequence is a block split over cp, and dp, the
// coarser split, takes whole sequences.
func BlockBox(m *Mesh, place []Placement, global Shape, coords []int) Box {
	blocks, blockAxis := make([]int, len(global)), make([]int, len(global))
	for i := range blocks {
		blocks[i], blockAxis[i] = 1, -1
	}
	for i, p := range place {
		if p.Kind == Shard && p.Dim < len(global) && p.NumBlocks() > 1 {
			blocks[p.Dim], blockAxis[p.Dim] = p.NumBlocks(), i
		}
	}
	// The device's part along each dim, in split order: outer over the
	// blocks, index inside each.
	outer, outerN := make([]int, len(global)), make([]int, len(global))
	index, innerN := make([]int, len(global)), make([]int, len(global))
	for d := range global {
		outerN[d], innerN[d] = 1, 1
	}
	inside := make([]bool, len(global))
	for d := range global {
		for _, i := range m.SplitOrderOn(d, place) {
			if i >= len(place) {
				continue
			}
			if p := place[i]; p.Kind != Shard || p.Dim != d {
				continue
			}
			if i == blockAxis[d] {
				inside[d] = true
			}
			if blockAxis[d] >= 0 && !inside[d] {
				outer[d] = outer[d]*m.Axes[i].Size + coords[i]
				outerN[d] *= m.Axes[i].Size
				continue
			}
			index[d] = index[d]*m.Axes[i].Size + coords[i]
			innerN[d] *= m.Axes[i].Size
		}
	}
	var b Box
	for d, n := range global {
		if blocks[d] > 1 {
			size := blocks[d] / outerN[d]
			b.Shape = append(b.Shape, blocks[d])
			b.Lo = append(b.Lo, outer[d]*size)
			b.Size = append(b.Size, size)
		}
		size := n / blocks[d] / innerN[d]
		b.Shape = append(b.Shape, n/blocks[d])
		b.Lo = append(b.Lo, index[d]*size)
		b.Size = append(b.Size, size)
	}
	return b
}
