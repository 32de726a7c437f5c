package ir

import (
	"fmt"
	"strconv"
	"strings"
)

// A stacked param (a mixture-of-experts layer's experts, [E, …]) may be
// written to weight files as E tensors of their own, under the names its
// ecosystem gives them (Hugging Face Mixtral's
// model.layers.0.block_sparse_moe.experts.3.w1.weight), while the program
// holds, shards and checkpoints it as one tensor. Two param attributes say
// so: save_each, the name of piece i with SaveEachIndex standing for i,
// and save_layout, how each piece is laid out in those files.
const (
	AttrSaveEach   = "save_each"
	AttrSaveLayout = "save_layout"
	// SaveEachIndex stands for the piece's index in a save_each name.
	SaveEachIndex = "{e}"
)

// Layouts of the pieces of a stacked param in weight files.
const (
	// PieceAsHeld: each piece is the param's slice [i] as it is.
	PieceAsHeld = ""
	// PieceOutIn: each piece has its last two dims swapped: an [in,out]
	// slice is stored [out,in], torch's nn.Linear layout.
	PieceOutIn = "out_in"
)

// SaveEach is how a stacked param is written to and read from weight
// files: piece i of its first dim under Name(i), in Layout.
type SaveEach struct {
	Template string `json:"template"`
	Layout   string `json:"layout,omitempty"`
}

// ParamSaveEach is the SaveEach a param declares (ok false when it is
// saved as one tensor), checked against its type.
func ParamSaveEach(v *Value) (s SaveEach, ok bool, err error) {
	tmpl, ok := v.Attrs[AttrSaveEach].(string)
	if !ok {
		return SaveEach{}, false, nil
	}
	s = SaveEach{Template: tmpl, Layout: v.Attrs.Str(AttrSaveLayout)}
	if err := s.Check(v.Type.Shape); err != nil {
		return s, true, fmt.Errorf("param %q: %w", v.Name(), err)
	}
	return s, true, nil
}

// Check says whether s can split a stacked tensor of shape stacked.
func (s SaveEach) Check(stacked Shape) error {
	if n := strings.Count(s.Template, SaveEachIndex); n != 1 {
		return fmt.Errorf("save_each name %q must hold %s exactly once (it holds it %d times)", s.Template, SaveEachIndex, n)
	}
	rank := 2
	switch s.Layout {
	case PieceAsHeld:
	case PieceOutIn:
		rank = 3
	default:
		return fmt.Errorf("save_layout %q: want %q or none", s.Layout, PieceOutIn)
	}
	if len(stacked) < rank {
		return fmt.Errorf("a stack of %v cannot be saved as pieces in layout %q: it needs rank ≥ %d", stacked, s.Layout, rank)
	}
	return nil
}

// Name is the file name of piece i.
func (s SaveEach) Name(i int) string {
	return strings.Replace(s.Template, SaveEachIndex, strconv.Itoa(i), 1)
}

// PieceShape is the shape of each piece of a stack of shape stacked, as
// files hold it.
func (s SaveEach) PieceShape(stacked Shape) []int {
	p := []int(stacked[1:].Clone())
	if s.Layout == PieceOutIn {
		n := len(p)
		p[n-2], p[n-1] = p[n-1], p[n-2]
	}
	return p
}
