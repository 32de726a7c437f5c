package ir

import "fmt"

// CheckLayerMarks refuses layer marks (Meta.Layer, the frontend's
// b.Layer) that no pipeline could cut, whatever the plan: ids with a gap
// (the ids are layers 0..L−1, so b.Layer(2*i) makes a model of more
// layers than it has, and b.Layer(i+1<<40) one whose every layer is
// last), and an op of a layer that reads a later layer's value, or a
// value computed outside the layers from a later layer (blocks marked in
// reverse, a block marked again after the next, a block after the head
// that reads it). Checked on one device too, the mistake is named
// where it is made, not first when the model is split over pp. A module
// that marks no layers passes.
func (m *Module) CheckLayerMarks() error {
	layers := 0
	marked := map[int]bool{}
	for _, x := range m.Values {
		layers = max(layers, x.Meta.Layer+1)
		if x.Meta.Layer >= 0 {
			marked[x.Meta.Layer] = true
		}
	}
	if len(marked) != layers {
		missing := 0
		for missing < layers && marked[missing] {
			missing++
		}
		last := ""
		for _, x := range m.Values {
			if x.Meta.Layer == layers-1 {
				last = x.Where()
				break
			}
		}
		return fmt.Errorf("the model marks layers up to %d (%s) but none %d: b.Layer(i) takes the block's index, counting from 0 without gaps (a pipeline cuts layers 0..L-1 by their ids)", layers-1, last, missing)
	}
	// A value outside every layer belongs to the latest layer it is
	// computed from (-1: none): an encoder's final norm, read by a
	// decoder's layers, is of the encoder's last layer. (Under pp the
	// split checks again by the stages it assigns.)
	of := map[*Value]int{}
	for _, x := range m.Values {
		if x.Meta.Layer >= 0 {
			of[x] = x.Meta.Layer
		} else {
			of[x] = -1
			for _, a := range x.Args {
				of[x] = max(of[x], of[a])
			}
		}
		if x.Meta.Layer < 0 {
			continue
		}
		for _, a := range x.Args {
			if of[a] > x.Meta.Layer {
				from := fmt.Sprintf("marked layer %d", a.Meta.Layer)
				if a.Meta.Layer < 0 {
					from = fmt.Sprintf("computed from layer %d", of[a])
				}
				return fmt.Errorf("%s, marked layer %d, reads %s, %s: a layer's ops read the values of earlier layers only, so b.Layer(i) must follow the data flow (blocks in order, the head after the last)",
					x.Where(), x.Meta.Layer, a.Where(), from)
			}
		}
	}
	return nil
}
