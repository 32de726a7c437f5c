package prepare

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// costlyEncoder is byteEncoder with about as much work per byte as a BPE
// tokenizer does, so that the workers' share of the time shows.
type costlyEncoder struct{ byteEncoder }

func (costlyEncoder) AppendEncode(dst []int32, text []byte) []int32 {
	h := uint32(2166136261)
	for _, c := range text {
		for range 24 {
			h = (h ^ uint32(c)) * 16777619
		}
		dst = append(dst, int32(c))
	}
	costSink.Store(h) // keeps the work from being optimized away
	return dst
}

var costSink atomic.Uint32

// BenchmarkRun measures Run's throughput, in MB of text (after
// decompression) per second. With the byte-level encoder, which costs next
// to nothing, this is Run's own work: reading, JSON parsing, batching,
// writing and the final fsyncs. The costly encoder shows how the workers
// share a tokenizer's work.
func BenchmarkRun(b *testing.B) {
	dir := b.TempDir()
	inputs := corpus(b, filepath.Join(dir, "in"), 16<<20)
	for _, tc := range []struct {
		name   string
		inputs []string
		enc    Encoder
	}{
		{"jsonl", inputs[:1], byteEncoder{}},
		{"jsonl.gz", inputs[2:3], byteEncoder{}},
		{"text-folder", inputs[1:2], byteEncoder{}},
		{"mixed", inputs, byteEncoder{}},
		{"jsonl-costly-encoder", inputs[:1], costlyEncoder{}},
	} {
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", tc.name, workers), func(b *testing.B) {
				opt := Options{Inputs: tc.inputs, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true, Workers: workers}
				sum, err := Run(context.Background(), tc.enc, opt)
				require.NoError(b, err)
				b.SetBytes(sum.TextBytes)
				b.ResetTimer()
				for b.Loop() {
					if _, err := Run(context.Background(), tc.enc, opt); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(sum.Documents), "docs/op")
			})
		}
	}
}
