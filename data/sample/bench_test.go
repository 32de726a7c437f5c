package sample

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// storeTokens is a Tokens holding real token arrays, so a benchmark pays
// for copying tokens as a reader of a mapped .bin would.
type storeTokens struct {
	starts []int
	flat   []int32
}

func newStore(lens []int) *storeTokens {
	s := &storeTokens{starts: make([]int, len(lens)+1)}
	for i, n := range lens {
		s.starts[i+1] = s.starts[i] + n
	}
	s.flat = make([]int32, s.starts[len(lens)])
	for i := range s.flat {
		s.flat[i] = int32(i % 50000)
	}
	return s
}

func (s *storeTokens) NumSequences() int     { return len(s.starts) - 1 }
func (s *storeTokens) SequenceLen(i int) int { return s.starts[i+1] - s.starts[i] }
func (s *storeTokens) Read(doc, off int, dst []int32) error {
	copy(dst, s.flat[s.starts[doc]+off:])
	return nil
}

// BenchmarkSample is one sample of 1024+1 tokens from a cached, mapped
// index: the lookup plus the token copy, across two epochs.
func BenchmarkSample(b *testing.B) {
	tok := newStore(lengths(4000, 1, 2000, 10))
	g, err := NewGPT(tok, Config{Seq: 1024, Range: [2]int{0, 4000}, CacheDir: b.TempDir(), Identity: "bench", Shuffle: true})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	dst := make([]int32, 1025)
	n := 2 * g.SamplesPerEpoch()
	for k := range n {
		if err := g.Sample(1, k, dst); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := g.Sample(1, int64(i)%n, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLocate is the index lookup alone: where a sample's tokens lie.
func BenchmarkLocate(b *testing.B) {
	tok := newFake(lengths(4000, 1, 2000, 10))
	g, err := NewGPT(tok, Config{Seq: 1024, Range: [2]int{0, 4000}, CacheDir: b.TempDir(), Identity: "bench", Shuffle: true})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	n := 2 * g.SamplesPerEpoch()
	var buf [8]span
	for k := range n {
		if _, err := g.locate(1, k, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := g.locate(1, int64(i)%n, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIndexBuild builds one epoch's index of 100,000 documents (about
// 30 million tokens, seq 1024) per iteration, into a cache folder and into
// memory, and reports documents indexed per second.
func BenchmarkIndexBuild(b *testing.B) {
	const docs = 100_000
	lens := lengths(docs, 1, 600, 11)
	for _, where := range []string{"disk", "memory"} {
		b.Run(where, func(b *testing.B) {
			cfg := Config{Seq: 1024, Range: [2]int{0, docs}, Identity: "build", Shuffle: true}
			if where == "disk" {
				cfg.CacheDir = b.TempDir()
			}
			g, err := NewGPT(newFake(lens), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			dst := make([]int32, 1025)
			b.ResetTimer()
			for i := range b.N {
				// A new seed is a new epoch index.
				if err := g.Sample(int64(i), 0, dst); err != nil {
					b.Fatal(err)
				}
				if where == "disk" {
					// Keep the folder from growing by an index per op.
					b.StopTimer()
					old, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "gpt-*.idx"))
					for _, f := range old {
						_ = os.Remove(f)
					}
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(docs)*float64(b.N)/b.Elapsed().Seconds(), "docs/s")
		})
	}
}

// BenchmarkFirstLookup is what a run reusing its index pays before its
// first sample (NewGPT, mapping the epoch, one sample), for 10^4 and 10^6
// documents: it should not grow with the dataset.
func BenchmarkFirstLookup(b *testing.B) {
	for _, docs := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("docs=%d", docs), func(b *testing.B) {
			lens := lengths(docs, 1, 600, 12)
			cfg := Config{Seq: 1024, Range: [2]int{0, docs}, CacheDir: b.TempDir(), Identity: "first", Shuffle: true}
			tok := newFake(lens)
			g, err := NewGPT(tok, cfg)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]int32, 1025)
			if err := g.Sample(1, 0, dst); err != nil {
				b.Fatal(err)
			}
			_ = g.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				g, err := NewGPT(tok, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if err := g.Sample(1, int64(i%1000), dst); err != nil {
					b.Fatal(err)
				}
				_ = g.Close()
			}
		})
	}
}
