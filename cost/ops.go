package cost

import (
	"math"
	"slices"
	"strings"

	"gcompile/ir"
)

// onMatrixUnits says whether an op's flops run on the matrix units
// (GEMMs and the fused attention ops, which are GEMMs inside); everything
// else runs at the vector rate.
func onMatrixUnits(op string) bool { return op == "matmul" || strings.HasPrefix(op, "attention") }

// OpTime is the time of one op of the given flops and bytes on a device:
// the slower of compute and memory traffic, each at its achieved
// efficiency, plus the launch overhead, and at least the host's time to
// issue it (HostOpUS).
func (h *Hardware) OpTime(op string, dtype ir.DType, flops, bytes int64) float64 {
	var compute float64
	if flops > 0 {
		f := float64(flops)
		if onMatrixUnits(op) {
			peak := h.Peak(dtype.String())
			half := peak * h.GEMMHalfUS * 1e-6
			compute = f / (peak * h.GEMMEfficiency * f / (f + half))
		} else {
			compute = f / (h.VectorTFLOPS * 1e12 * h.MemEfficiency)
		}
	}
	t := math.Max(compute, h.memTime(float64(bytes)))
	if k, ok := h.OpScale[op]; ok {
		t *= k
		if flops > 0 && onMatrixUnits(op) {
			// A scale below 1 may say a kernel beats the efficiency
			// curve (a fitted one), never the peak itself: the MFU
			// would pass 100 %.
			t = math.Max(t, float64(flops)/h.Peak(dtype.String()))
		}
	}
	return h.kernels(1, h.LaunchUS*1e-6+t)
}

// kernels is n kernels that take device seconds together, or the host's
// time to issue them when that is longer (Hardware.HostOpUS).
func (h *Hardware) kernels(n, device float64) float64 {
	return math.Max(device, n*h.HostOpUS*1e-6)
}

// memTime is the time to move n bytes through device memory at the
// efficiency curve of memory-bound kernels.
func (h *Hardware) memTime(n float64) float64 {
	if n <= 0 {
		return 0
	}
	bw := h.MemoryGBps * 1e9
	half := bw * h.MemHalfUS * 1e-6
	return n / (bw * h.MemEfficiency * n / (n + half))
}

// Link is what a collective group crosses: within a node or between
// nodes.
type Link struct {
	GBps, LatencyUS float64
	InterNode       bool
}

// LinkFor is the slowest link between any two of ranks, with devices
// numbered node by node (DevicesPerNode consecutive ranks a node, as
// launchers place them and runtime.Layout assumes).
//
// A group that spans nodes crosses them on the network cards of its
// members: InterGBps is one device's share (a DGX has one card per GPU),
// and a ring or tree over k members per node spreads its node-crossing
// traffic over their k cards (NCCL runs one channel per card), so the
// crossing carries k·InterGBps, and never more than the NVLink inside the
// node. A group with one member per node (data parallelism across
// tensor-parallel replicas, a pipeline transfer) gets one card's share.
func (h *Hardware) LinkFor(ranks []int) Link {
	if len(ranks) > 0 {
		// Groups are rank-ordered (Mesh.AxisRanks): a node's ranks are
		// one run, counted in a pass; other orders take a map.
		nodes, k := 0, len(ranks)
		if slices.IsSorted(ranks) {
			for i := 0; i < len(ranks); {
				j := i + 1
				for j < len(ranks) && ranks[j]/h.DevicesPerNode == ranks[i]/h.DevicesPerNode {
					j++
				}
				nodes, k = nodes+1, min(k, j-i)
				i = j
			}
		} else {
			perNode := map[int]int{}
			for _, r := range ranks {
				perNode[r/h.DevicesPerNode]++
			}
			nodes = len(perNode)
			for _, n := range perNode {
				k = min(k, n)
			}
		}
		if nodes > 1 {
			return Link{GBps: math.Min(h.IntraGBps, float64(k)*h.InterGBps), LatencyUS: h.InterLatencyUS, InterNode: true}
		}
	}
	return Link{GBps: h.IntraGBps, LatencyUS: h.IntraLatencyUS}
}

// Collective is the time of one collective call over n ranks on link l.
// bytes is the size of the whole (unsplit) tensor: the input of an
// all-reduce, the output of an all-gather, the input of a reduce-scatter.
//
// All-reduce takes the faster of ring (2(n−1) steps of bytes/n each) and
// a double binary tree (2·log2 n steps of latency, the whole tensor twice
// at link rate; NCCL picks between the two the same way, by size). The
// others are rings: n−1 steps of bytes/n.
func Collective(kind string, n int, bytes float64, l Link) float64 {
	if n <= 1 || bytes <= 0 {
		return 0
	}
	alpha, beta := l.LatencyUS*1e-6, 1/(l.GBps*1e9)
	fn := float64(n)
	switch kind {
	case "all_reduce":
		ring := 2*(fn-1)*alpha + 2*(fn-1)/fn*bytes*beta
		tree := 2*math.Ceil(math.Log2(fn))*alpha + 2*bytes*beta
		return math.Min(ring, tree)
	default: // reduce_scatter, all_gather, all_to_all
		return (fn-1)*alpha + (fn-1)/fn*bytes*beta
	}
}

// P2P is one point-to-point transfer of bytes on link l.
func P2P(bytes float64, l Link) float64 {
	if bytes <= 0 {
		return 0
	}
	return l.LatencyUS*1e-6 + bytes/(l.GBps*1e9)
}
