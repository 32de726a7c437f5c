//go:build unix

package sample

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openWithin runs open and returns its error, failing the test when it has
// not returned after a few seconds: opening a FIFO for reading waits for a
// writer, so a regression would otherwise hang the test binary.
func openWithin(t *testing.T, fifo string, open func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- open() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		// A writer lets the blocked open return, so the goroutine ends.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = w.Close()
		}
		t.Fatalf("still opening after 5 s with %s a FIFO: it must be refused before it is opened", fifo)
		return nil
	}
}

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
			err = openWithin(t, fifo, func() error {
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
