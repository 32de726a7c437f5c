package checkpoint

import (
	"fmt"
	"slices"

	"gcompile/ir"
)

// SplitEach returns ts with every tensor that each names replaced by its
// pieces (ir.SaveEach): slice i of its first dim under the piece's name,
// with its last two dims swapped in the out_in layout. The pieces take the
// stacked tensor's place in the list; other tensors are kept as they are.
// --save and export write weight files so.
func SplitEach(ts []Tensor, each map[string]ir.SaveEach) ([]Tensor, error) {
	if len(each) == 0 {
		return ts, nil
	}
	out := make([]Tensor, 0, len(ts))
	for _, t := range ts {
		s, ok := each[t.Name]
		if !ok {
			out = append(out, t)
			continue
		}
		if err := s.Check(t.Shape); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		es, err := elementSize(t)
		if err != nil {
			return nil, err
		}
		n := t.Shape[0]
		per := len(t.Data) / max(n, 1)
		held := t.Shape[1:]
		for i := range n {
			data := t.Data[i*per : (i+1)*per]
			if s.Layout == ir.PieceOutIn {
				data = swapLastTwo(data, held, es)
			} else {
				data = slices.Clone(data)
			}
			out = append(out, Tensor{Name: s.Name(i), DType: t.DType, Shape: s.PieceShape(t.Shape), Data: data})
		}
	}
	return out, nil
}

// JoinEach is SplitEach's inverse, for reading weight files: every param
// of each (its stacked shape in shapes) that ts holds no tensor of is
// assembled from its pieces, which it replaces, in piece 0's place. All
// its pieces must be there, of the piece's shape and of one dtype. A
// stacked tensor ts holds under the param's own name (a checkpoint
// consolidated by gcompile) is kept, and its pieces are not looked for.
func JoinEach(ts []Tensor, each map[string]ir.SaveEach, shapes map[string][]int) ([]Tensor, error) {
	if len(each) == 0 {
		return ts, nil
	}
	at := map[string]int{}
	for i, t := range ts {
		at[t.Name] = i
	}
	joined := map[int]Tensor{} // piece 0's index → the stacked tensor
	drop := map[int]bool{}     // indices of the other pieces
	for _, name := range sortedKeys(each) {
		if _, ok := at[name]; ok {
			continue
		}
		s, stacked := each[name], shapes[name]
		if err := s.Check(stacked); err != nil {
			return nil, fmt.Errorf("param %q: %w", name, err)
		}
		n, want := stacked[0], s.PieceShape(stacked)
		var t Tensor
		for i := range n {
			j, ok := at[s.Name(i)]
			if !ok {
				return nil, fmt.Errorf("no tensor %q (piece %d of the %d of param %q, saved as %q)", s.Name(i), i, n, name, s.Template)
			}
			p := ts[j]
			if !slices.Equal(p.Shape, want) {
				return nil, fmt.Errorf("tensor %q is %s%v; as piece %d of param %q %v it must be %v", p.Name, p.DType, p.Shape, i, name, stacked, want)
			}
			es, err := elementSize(p)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				t = Tensor{Name: name, DType: p.DType, Shape: slices.Clone(stacked), Data: make([]byte, 0, n*len(p.Data))}
			} else {
				if p.DType != t.DType {
					return nil, fmt.Errorf("tensor %q is %s but %q is %s: the pieces of param %q must share a dtype", p.Name, p.DType, s.Name(0), t.DType, name)
				}
				drop[j] = true
			}
			data := p.Data
			if s.Layout == ir.PieceOutIn {
				data = swapLastTwo(data, p.Shape, es)
			}
			t.Data = append(t.Data, data...)
		}
		joined[at[s.Name(0)]] = t
	}
	out := make([]Tensor, 0, len(ts))
	for i, t := range ts {
		if j, ok := joined[i]; ok {
			out = append(out, j)
		} else if !drop[i] {
			out = append(out, t)
		}
	}
	return out, nil
}

// elementSize is the bytes of one element of t, whose data must be
// exactly its shape's.
func elementSize(t Tensor) (int, error) {
	es, ok := dtypeSizes[t.DType]
	if !ok {
		return 0, fmt.Errorf("tensor %q: dtype %q: %w", t.Name, t.DType, ErrDType)
	}
	n, err := byteSize(t.Shape, es)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if n != int64(len(t.Data)) {
		return 0, fmt.Errorf("tensor %q %s%v holds %d bytes, not %d: %w", t.Name, t.DType, t.Shape, len(t.Data), n, ErrDataSize)
	}
	return es, nil
}

// swapLastTwo is data, row-major of shape (…, r, c) with elements of es
// bytes, laid out as (…, c, r).
func swapLastTwo(data []byte, shape []int, es int) []byte {
	k := len(shape)
	r, c := shape[k-2], shape[k-1]
	out := make([]byte, len(data))
	mat := r * c * es
	if mat == 0 {
		return out
	}
	for base := 0; base < len(data); base += mat {
		for i := range r {
			for j := range c {
				src := base + (i*c+j)*es
				dst := base + (j*r+i)*es
				copy(out[dst:dst+es], data[src:src+es])
			}
		}
	}
	return out
}
