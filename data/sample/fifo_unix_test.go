//go:build unix

package sample

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/internal/fifotest"
)

// TestCacheFIFORebuilt puts a FIFO in place of each kind of cache file: it
// is taken for a stale file and replaced by a rebuilt one, without waiting
// for a writer.
func TestCacheFIFORebuilt(t *testing.T) {
	lens := lengths(100, 1, 30, 4)
	for _, glob := range []string{"gpt-*.idx", "docs-*.sum"} {
		t.Run(glob, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Seq: 6, Range: [2]int{0, 100}, CacheDir: dir, Identity: "fifo", Shuffle: true}
			g, err := NewGPT(newFake(lens), cfg)
			require.NoError(t, err)
			ks := span64(0, g.SamplesPerEpoch())
			want := draw(t, g, 8, ks)
			require.NoError(t, g.Close())
			files, err := filepath.Glob(filepath.Join(dir, glob))
			require.NoError(t, err)
			require.Len(t, files, 1)
			fifo := files[0]
			require.NoError(t, os.Remove(fifo))
			require.NoError(t, syscall.Mkfifo(fifo, 0o644))

			var got [][]int32
			err = fifotest.OpenWithin(t, fifo, func() error {
				g, err = NewGPT(newFake(lens), cfg)
				if err != nil {
					return err
				}
				got = make([][]int32, len(ks))
				for i, k := range ks {
					got[i] = make([]int32, cfg.Seq+1)
					if err := g.Sample(8, k, got[i]); err != nil {
						return err
					}
				}
				return g.Close()
			})
			require.NoError(t, err)
			assert.Equal(t, want, got)
			st := g.Stats()
			assert.Equal(t, 1, st.Rebuilt, "%+v", st)
			fi, err := os.Stat(fifo)
			require.NoError(t, err)
			assert.True(t, fi.Mode().IsRegular(), "the FIFO is replaced: %s", fi.Mode())
		})
	}
}
