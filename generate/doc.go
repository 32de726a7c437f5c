// Package generate is the host side of text generation: the work that
// happens between the steps a compiled program runs on a device.
//
// It chooses each next token from a step's logits ([Sampling]: greedy,
// temperature, top-k and top-p) and decides where generated text ends
// ([StopAt], [Holdback]).
//
// Sampling is reproducible by construction. The random number behind a
// draw is derived from the seed, the sequence's index and the step alone,
// not drawn from a shared generator, so a run gives the same tokens on any
// machine, in any process, whatever the batch size and whatever order the
// sequences are sampled in.
package generate
