//go:build unix

package prepare

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A file reached a second time, through a symbolic link or a hard link in
// a folder, is read once: its documents were written twice.
func TestRunReadsEachFileOnce(t *testing.T) {
	enc := byteEncoder{}
	tests := []struct {
		name    string
		files   map[string]string
		links   map[string]string // link (in the folder) -> target, relative to the link
		hard    map[string]string // hard link -> file, both relative to the folder
		inputs  []string          // relative to the folder; the folder itself if empty
		want    [][]int32
		nFiles  int
		dups    int
		summary string
	}{
		{
			name:  "a link to a file the walk read before",
			files: map[string]string{"tree/a.txt": "visible"},
			links: map[string]string{"tree/sub/link.txt": "../a.txt"},
			want:  enc.want("visible"), nFiles: 1, dups: 1, summary: "1 duplicate files",
		},
		{
			name:  "a link read before its target",
			files: map[string]string{"tree/b.txt": "target"},
			links: map[string]string{"tree/a.txt": "b.txt"},
			want:  enc.want("target"), nFiles: 1, dups: 1,
		},
		{
			name:  "two links to a file outside the folder",
			files: map[string]string{"outside.txt": "outside", "tree/c.txt": "own"},
			links: map[string]string{"tree/a.txt": "../outside.txt", "tree/b.txt": "../outside.txt"},
			want:  enc.want("outside", "own"), nFiles: 2, dups: 1,
		},
		{
			name:   "a link to a file named before the folder",
			files:  map[string]string{"a.txt": "named"},
			links:  map[string]string{"tree/link.txt": "../a.txt"},
			inputs: []string{"a.txt", "tree"},
			want:   enc.want("named"), nFiles: 1, dups: 1,
		},
		{
			name:  "a hard link",
			files: map[string]string{"tree/a.txt": "hard"},
			hard:  map[string]string{"tree/b.txt": "tree/a.txt"},
			want:  enc.want("hard"), nFiles: 1, dups: 1,
		},
		{
			name:  "two files with the same text are two documents",
			files: map[string]string{"tree/a.txt": "same", "tree/b.txt": "same"},
			want:  enc.want("same", "same"), nFiles: 2, dups: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, tc.files)
			for link, target := range tc.links {
				p := filepath.Join(dir, link)
				require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				require.NoError(t, os.Symlink(target, p))
			}
			for link, file := range tc.hard {
				require.NoError(t, os.Link(filepath.Join(dir, file), filepath.Join(dir, link)))
			}
			opt := Options{Inputs: []string{filepath.Join(dir, "tree")}, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true}
			if tc.inputs != nil {
				opt.Inputs = nil
				for _, p := range tc.inputs {
					opt.Inputs = append(opt.Inputs, filepath.Join(dir, p))
				}
			}
			sum, err := Run(context.Background(), enc, opt)
			require.NoError(t, err)
			assert.Equal(t, tc.want, readDataset(t, opt.OutputPrefix))
			assert.Equal(t, tc.nFiles, sum.Files)
			assert.Equal(t, tc.dups, sum.DuplicateFiles)
			assert.Contains(t, sum.String(), tc.summary)
		})
	}
}
