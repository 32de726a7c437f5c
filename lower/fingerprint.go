package lower

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"math"
	"slices"

	"gcompile/ir"
)

// fingerprintVersion starts every fingerprint's input, so a change of the
// encoding below changes every fingerprint rather than colliding with the
// old one.
const fingerprintVersion = "gcompile lower.Fingerprint v1"

// Fingerprint is a hex SHA-256 of everything that decides what the programs
// compute and how their memory is laid out: per program its name, mesh,
// arena sizes, every buffer (id, kind, name, local and global type,
// placement, offset, bytes, host flag), every instruction (op, attributes,
// arguments, output, local types, scale, bucket, peer, tag, block, frees),
// outputs, sources and ForwardEnd, in the order given.
//
// When each rank of a job runs in its own process and compiles its own
// plan, the processes compare fingerprints before the first step: equal
// fingerprints mean every process compiled the same plan, so their
// collectives and transfers line up; a difference means different flags,
// models or compiler builds. The encoding therefore depends on nothing but
// the programs' contents: maps are hashed in sorted key order and no
// pointer is hashed (source positions are left out too, since checkouts on
// different machines may sit at different paths).
func Fingerprint(progs ...*Program) string {
	e := fpEncoder{h: sha256.New()}
	e.str(fingerprintVersion)
	e.int(int64(len(progs)))
	for _, p := range progs {
		e.program(p)
	}
	return hex.EncodeToString(e.h.Sum(nil))
}

// fpEncoder writes values unambiguously: fixed-width integers, and a
// length before every string and list, so two different programs cannot
// encode to the same bytes.
type fpEncoder struct {
	h   hash.Hash
	buf [8]byte
}

func (e *fpEncoder) int(n int64) {
	binary.BigEndian.PutUint64(e.buf[:], uint64(n))
	e.h.Write(e.buf[:])
}

func (e *fpEncoder) bool(b bool) {
	if b {
		e.int(1)
	} else {
		e.int(0)
	}
}

func (e *fpEncoder) float(f float64) { e.int(int64(math.Float64bits(f))) }

func (e *fpEncoder) str(s string) {
	e.int(int64(len(s)))
	e.h.Write([]byte(s))
}

func (e *fpEncoder) ints(xs []int) {
	e.int(int64(len(xs)))
	for _, x := range xs {
		e.int(int64(x))
	}
}

func (e *fpEncoder) typ(t ir.Type) {
	e.int(int64(t.DType))
	e.ints(t.Shape)
}

func (e *fpEncoder) program(p *Program) {
	if p == nil {
		e.str("nil program")
		return
	}
	e.str("program")
	e.str(p.Name)
	if p.Mesh == nil {
		e.int(-1)
	} else {
		e.int(int64(len(p.Mesh.Axes)))
		for _, a := range p.Mesh.Axes {
			name := a.Name
			if a.Zigzag {
				name += ":zigzag"
			}
			e.str(name)
			e.int(int64(a.Size))
		}
	}
	e.int(p.ArenaBytes)
	e.int(p.HostBytes)
	e.int(p.PeakBytes)
	e.int(p.PersistentBytes)
	e.int(int64(p.ForwardEnd))

	e.int(int64(len(p.Buffers)))
	for _, b := range p.Buffers {
		e.int(int64(b.ID))
		e.int(int64(b.Kind))
		e.str(b.Name)
		e.typ(b.Type)
		e.typ(b.Global)
		if b.Place == nil {
			e.int(-1)
		} else {
			e.int(int64(len(b.Place)))
			for _, pl := range b.Place {
				// As Placement.Equal reads them: Dim and Blocks mean
				// something only for Shard, and Blocks 0 is 1.
				e.int(int64(pl.Kind))
				if pl.Kind == ir.Shard {
					e.int(int64(pl.Dim))
					e.int(int64(pl.NumBlocks()))
				}
			}
		}
		e.int(b.Offset)
		e.int(b.Bytes)
		e.bool(b.Host)
	}

	e.int(int64(len(p.Instrs)))
	for _, in := range p.Instrs {
		e.str(in.Op)
		e.attrs(in.Attrs)
		e.ints(in.Args)
		e.int(int64(in.Out))
		e.int(int64(len(in.ArgTypes)))
		for _, t := range in.ArgTypes {
			e.typ(t)
		}
		e.typ(in.OutType)
		e.float(in.Scale)
		e.int(int64(in.Bucket))
		e.int(int64(in.Peer))
		e.int(int64(in.Tag))
		e.str(in.Block)
		e.ints(in.Frees)
		e.ints(in.Scratch)
	}

	e.names(p.Outputs)
	e.names(p.Sources)
	if p.SerialBuckets {
		// Last, and only when set: every other program keeps its
		// fingerprint.
		e.str("serial buckets")
	}
}

// names hashes a name → buffer map in name order.
func (e *fpEncoder) names(m map[string]int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.int(int64(len(keys)))
	for _, k := range keys {
		e.str(k)
		e.int(int64(m[k]))
	}
}

// attrs hashes attributes in key order, as ir prints them, each value with
// its kind so that 1 and true or "1" differ.
func (e *fpEncoder) attrs(a ir.Attrs) {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.int(int64(len(keys)))
	for _, k := range keys {
		e.str(k)
		switch x := a[k].(type) {
		case int:
			e.str("int")
			e.int(int64(x))
		case []int:
			e.str("ints")
			e.ints(x)
		case ir.Shape:
			e.str("ints")
			e.ints(x)
		case float64:
			e.str("float")
			e.float(x)
		case string:
			e.str("string")
			e.str(x)
		case bool:
			e.str("bool")
			e.bool(x)
		default:
			// Not a kind the op table declares; its printed form is the
			// best deterministic stand-in (fmt prints maps sorted).
			e.str(fmt.Sprintf("%T", x))
			e.str(fmt.Sprintf("%v", x))
		}
	}
}
