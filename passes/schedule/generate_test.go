package schedule

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGeneratorValidation(t *testing.T) {
	cases := []struct {
		name    string
		p, v, m int
		want    []string
	}{
		{"1f1b", 4, 1, 3, []string{"1f1b over pp=4 ranks needs at least 4 microbatches, got 3"}},
		{"2bw", 4, 1, 2, []string{"2bw over pp=4 ranks needs at least 4 microbatches"}},
		{"zb", 8, 1, 7, []string{"zb over pp=8 ranks needs at least 8 microbatches"}},
		{"interleaved", 4, 2, 2, []string{"interleaved over pp=4 ranks needs at least 4 microbatches"}},
		{"interleaved", 4, 2, 6, []string{"interleaved needs microbatches a multiple of pp", "6 microbatches, pp=4"}},
		{"interleaved", 4, 1, 8, []string{"interleaved needs --vpp ≥ 2", "use --schedule 1f1b"}},
		{"gpipe", 2, 2, 4, []string{"--vpp > 1 only for interleaved", "gpipe"}},
		{"1f1b", 2, 3, 4, []string{"--vpp > 1 only for interleaved"}},
		{"pipedream", 2, 2, 4, []string{`unknown schedule "pipedream"`, "gpipe, 1f1b, interleaved, 2bw, zb"}},
		{"gpipe", 0, 1, 4, []string{"≥ 1", "pp=0"}},
		{"1f1b", 2, 1, 0, []string{"≥ 1", "0 microbatches"}},
		{"interleaved", 2, 0, 4, []string{"≥ 1", "vpp=0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.name, c.p, c.v, c.m)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrConfig)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// The direct constructors enforce the same rules.
	_, err := Interleaved(2, 1, 4)
	require.ErrorIs(t, err, ErrConfig)
	_, err = OneFOneB(3, 2)
	require.ErrorIs(t, err, ErrConfig)
	_, err = TwoBW(3, 2)
	require.ErrorIs(t, err, ErrConfig)
	_, err = ZeroBubble(0, 2)
	require.ErrorIs(t, err, ErrConfig)
	_, err = GPipe(2, 0)
	require.ErrorIs(t, err, ErrConfig)
}

// GPipe has no m ≥ p rule: with fewer microbatches it still runs, only with
// a larger bubble.
func TestGPipeFewMicrobatches(t *testing.T) {
	s, err := GPipe(4, 2)
	require.NoError(t, err)
	res, err := Simulate(s, UnitCost)
	require.NoError(t, err)
	assert.InDelta(t, 3.0/2.0, res.Bubble, 1e-12)
}

func TestTwoBWMatches1F1BOrder(t *testing.T) {
	a, err := TwoBW(4, 8)
	require.NoError(t, err)
	b, err := OneFOneB(4, 8)
	require.NoError(t, err)
	assert.Equal(t, "2bw", a.Name)
	assert.Equal(t, b.Actions, a.Actions)
}

func TestRankOf(t *testing.T) {
	s := &Schedule{Ranks: 4, Chunks: 2}
	assert.Equal(t, []int{0, 1, 2, 3, 0, 1, 2, 3}, []int{s.RankOf(0), s.RankOf(1), s.RankOf(2), s.RankOf(3), s.RankOf(4), s.RankOf(5), s.RankOf(6), s.RankOf(7)})
}

// Each generator's schedules keep every rank's work on that rank and close
// with sync, opt.
func TestGeneratedShape(t *testing.T) {
	for _, c := range generatorCases() {
		s, err := New(c.name, c.p, c.v, c.m)
		require.NoError(t, err)
		require.NoError(t, s.Validate(), c.String())
		assert.Equal(t, c.name, s.Name)
		for r, acts := range s.Actions {
			n := len(acts)
			require.GreaterOrEqual(t, n, 2)
			assert.Equal(t, GradSync, acts[n-2].Kind)
			assert.Equal(t, Optim, acts[n-1].Kind)
			for _, a := range acts[:n-2] {
				assert.Equal(t, r, s.RankOf(a.Chunk), "%s rank %d %s", c, r, a)
			}
		}
	}
}

func BenchmarkGenerateSimulate(b *testing.B) {
	cases := []struct {
		name    string
		p, v, m int
	}{
		{"interleaved", 64, 2, 3072},
		{"1f1b", 64, 1, 3072},
	}
	for _, c := range cases {
		b.Run(genCase{c.name, c.p, c.v, c.m}.String(), func(b *testing.B) {
			for b.Loop() {
				s, err := New(c.name, c.p, c.v, c.m)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Simulate(s, UnitCost); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/op")
		})
	}
}
