package schedule

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type genCase struct {
	name    string
	p, v, m int
}

func (c genCase) String() string { return fmt.Sprintf("%s/p=%d/v=%d/m=%d", c.name, c.p, c.v, c.m) }

// generatorCases covers every generator on a few shapes, including the
// single-rank ones that must emit no transfers at all.
func generatorCases() []genCase {
	var cs []genCase
	for _, name := range []string{"gpipe", "1f1b", "2bw", "zb"} {
		for _, pm := range [][2]int{{1, 1}, {1, 3}, {2, 2}, {2, 5}, {3, 7}, {4, 8}} {
			cs = append(cs, genCase{name, pm[0], 1, pm[1]})
		}
	}
	for _, pvm := range [][3]int{{1, 2, 3}, {2, 2, 4}, {2, 3, 2}, {3, 2, 6}, {4, 2, 8}, {4, 3, 12}} {
		cs = append(cs, genCase{"interleaved", pvm[0], pvm[1], pvm[2]})
	}
	return cs
}

func TestActionString(t *testing.T) {
	cases := []struct {
		a    Action
		want string
	}{
		{Action{Kind: F}, "0F0"},
		{Action{Kind: B, Chunk: 3, Micro: 12}, "3B12"},
		{Action{Kind: W, Chunk: 10, Micro: 7}, "10W7"},
		{Action{Kind: SendF, Chunk: 0, Micro: 2, Peer: 1}, "0sf2>r1"},
		{Action{Kind: RecvF, Chunk: 1, Micro: 2, Peer: 0}, "1rf2<r0"},
		{Action{Kind: SendB, Chunk: 5, Micro: 0, Peer: 4}, "5sb0>r4"},
		{Action{Kind: RecvB, Chunk: 4, Micro: 31, Peer: 5}, "4rb31<r5"},
		{Action{Kind: GradSync}, "sync"},
		{Action{Kind: Optim}, "opt"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.a.String())
		got, err := parseAction(c.want)
		require.NoError(t, err, c.want)
		assert.Equal(t, c.a, got, c.want)
	}
	assert.Equal(t, "Kind(42)", Action{Kind: 42}.String())
	assert.Equal(t, "RecvB", RecvB.String())
}

func TestRoundTrip(t *testing.T) {
	for _, c := range generatorCases() {
		t.Run(c.String(), func(t *testing.T) {
			s, err := New(c.name, c.p, c.v, c.m)
			require.NoError(t, err)
			text := s.String()
			back, err := Parse(text)
			require.NoError(t, err)
			assert.Equal(t, s, back)
			assert.Equal(t, text, back.String())
			require.NoError(t, back.Validate())
		})
	}
}

func TestStringFormat(t *testing.T) {
	s, err := OneFOneB(2, 2)
	require.NoError(t, err)
	want := "schedule 1f1b p=2 v=1 m=2\n" +
		"rank 0: 0F0 0sf0>r1 0F1 0sf1>r1 0rb0<r1 0B0 0rb1<r1 0B1 sync opt\n" +
		"rank 1: 1rf0<r0 1F0 1B0 1sb0>r0 1rf1<r0 1F1 1B1 1sb1>r0 sync opt\n"
	assert.Equal(t, want, s.String())
}

func TestParseSkipsCommentsAndBlankLines(t *testing.T) {
	text := "# a hand-written schedule\n\nschedule custom p=1 v=1 m=1\n\nrank 0:   0F0  0B0 sync opt  \n"
	s, err := Parse(text)
	require.NoError(t, err)
	assert.Equal(t, "custom", s.Name)
	assert.Len(t, s.Actions[0], 4)
	_, err = Simulate(s, nil)
	require.NoError(t, err)
}

func TestParseErrors(t *testing.T) {
	const hdr = "schedule 1f1b p=2 v=1 m=2\n"
	cases := []struct {
		name, text string
		want       []string
	}{
		{"empty", "", []string{"empty input"}},
		{"no header", "rank 0: 0F0\n", []string{"line 1", "expected header"}},
		{"bad p", "schedule x p=0 v=1 m=1\n", []string{"line 1", `"p=0"`, "positive"}},
		{"bad key", "schedule x p=1 q=1 m=1\n", []string{"line 1", `"q=1"`, "v=N"}},
		{"bad token", hdr + "rank 0: 0F0 0X1 sync\nrank 1:\n", []string{"line 2", "token 2", `"0X1"`}},
		{"trailing junk", hdr + "rank 0: 0F0x\n", []string{"line 2", `"0F0x"`, "unexpected"}},
		{"bad arrow", hdr + "rank 0: 0sf0<r1\n", []string{"line 2", `"0sf0<r1"`, `">r"`}},
		{"no peer", hdr + "rank 0: 0rf0<r\n", []string{"line 2", "peer rank"}},
		{"no micro", hdr + "rank 0: 0F\n", []string{"line 2", "microbatch"}},
		{"no chunk", hdr + "rank 0: F0\n", []string{"line 2", "chunk"}},
		{"huge number", hdr + "rank 0: 99999999999999999999F0\n", []string{"line 2", "chunk"}},
		{"rank order", hdr + "rank 1: 1F0\n", []string{"line 2", `"rank 0:"`}},
		{"not a rank line", hdr + "stage 0: 0F0\n", []string{"line 2", `"stage"`}},
		{"too many ranks", hdr + "rank 0:\nrank 1:\nrank 2:\n", []string{"line 4", "p=2"}},
		{"too few ranks", hdr + "rank 0: 0F0\n", []string{"p=2", "1 rank lines"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.text)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrParse)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// Transfers appear exactly at rank boundaries: never on a single rank, and
// for interleaved between every pair of consecutive chunks when p > 1.
func TestTransferInsertion(t *testing.T) {
	count := func(s *Schedule) int {
		n := 0
		for _, acts := range s.Actions {
			for _, a := range acts {
				if a.Kind >= SendF && a.Kind <= RecvB {
					n++
				}
			}
		}
		return n
	}
	for _, c := range generatorCases() {
		s, err := New(c.name, c.p, c.v, c.m)
		require.NoError(t, err)
		boundaries := 0
		if c.p > 1 {
			boundaries = c.p*c.v - 1
		}
		// Four transfers (sf, rf, sb, rb) per boundary per microbatch.
		assert.Equal(t, 4*boundaries*c.m, count(s), c.String())
	}
}

func TestExamplesPrint(t *testing.T) {
	s, err := OneFOneB(4, 8)
	require.NoError(t, err)
	// Rank 3 (last) does no warm-up: strict F/B alternation.
	assert.True(t, strings.HasPrefix(s.String(), "schedule 1f1b p=4 v=1 m=8\nrank 0: 0F0 0sf0>r1 0F1 0sf1>r1 0F2 0sf2>r1 0F3 0sf3>r1 0rb0<r1 0B0"))
	assert.Contains(t, s.String(), "rank 3: 3rf0<r2 3F0 3B0 3sb0>r2 3rf1<r2 3F1 3B1")

	s, err = Interleaved(2, 2, 4)
	require.NoError(t, err)
	// Rank 0 runs microbatches 0,1 through chunk 0, then through chunk 2.
	assert.Contains(t, s.String(), "rank 0: 0F0 0sf0>r1 0F1 0sf1>r1 2rf0<r1 2F0 2sf0>r1 2rf1<r1 2F1 2sf1>r1")
}

// Parse must never panic, and whatever it accepts must print back to text
// that parses to the same schedule.
func FuzzParse(f *testing.F) {
	for _, c := range generatorCases()[:6] {
		s, err := New(c.name, c.p, c.v, c.m)
		require.NoError(f, err)
		f.Add(s.String())
	}
	f.Add("schedule x p=1 v=1 m=1\nrank 0: 0F0 0B0 sync opt\n")
	f.Add("schedule x p=2 v=1 m=1\nrank 0: 0sf0>r1\nrank 1: 1rf0<r0 0F-1\n")
	f.Fuzz(func(t *testing.T, text string) {
		s, err := Parse(text)
		if err != nil {
			return
		}
		back, err := Parse(s.String())
		require.NoError(t, err)
		assert.Equal(t, s, back)
		_, _ = Simulate(s, nil) // any outcome but a panic is fine
	})
}
