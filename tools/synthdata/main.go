// Command synthdata writes a token dataset of a given size in Megatron-LM's
// indexed format (PREFIX.bin, PREFIX.idx) with documents of random lengths
// and random ids, for the benchmarks that show that opening a dataset and
// reaching the first training step do not depend on its size. Tokenizing
// real text that large would take an hour; the data path past the
// tokenizer cannot tell the difference.
//
//	go run ./tools/synthdata -tokens 5e9 -vocab 50257 -out /tmp/big
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"gcompile/data/indexed"
)

func main() {
	tokens := flag.Float64("tokens", 1e6, "tokens in all (the .bin is twice this in bytes for a vocabulary up to 65536)")
	vocab := flag.Int("vocab", 50257, "ids are drawn from 0..vocab-1")
	meanDoc := flag.Int("mean-doc", 1000, "mean document length in tokens (lengths are uniform in 1..2·mean)")
	seed := flag.Uint64("seed", 1, "random seed")
	out := flag.String("out", "", "output prefix")
	flag.Parse()
	if *out == "" || *tokens < 1 || *vocab < 2 || *meanDoc < 1 {
		fmt.Fprintln(os.Stderr, "synthdata: want -out PREFIX, -tokens ≥ 1, -vocab ≥ 2, -mean-doc ≥ 1")
		os.Exit(2)
	}
	if err := run(int64(*tokens), *vocab, *meanDoc, *seed, *out); err != nil {
		fmt.Fprintln(os.Stderr, "synthdata:", err)
		os.Exit(1)
	}
}

func run(total int64, vocab, meanDoc int, seed uint64, out string) error {
	start := time.Now()
	w, err := indexed.Create(out, indexed.DTypeFor(vocab))
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	buf := make([]int32, 2*meanDoc)
	var done, docs int64
	for done < total {
		n := min(int64(1+rng.IntN(2*meanDoc)), total-done)
		doc := buf[:n]
		for i := range doc {
			doc[i] = int32(rng.IntN(vocab))
		}
		if err := w.Add(doc); err != nil {
			w.Abort()
			return err
		}
		done += n
		docs++
	}
	if err := w.Commit(); err != nil {
		return err
	}
	fmt.Printf("%s: %d documents, %d tokens in %.1f s\n", out, docs, done, time.Since(start).Seconds())
	return nil
}
