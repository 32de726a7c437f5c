package schedule

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func valid1F1B(t *testing.T) *Schedule {
	t.Helper()
	s, err := OneFOneB(2, 4)
	require.NoError(t, err)
	return s
}

func find(t *testing.T, acts []Action, text string) int {
	t.Helper()
	for i, a := range acts {
		if a.String() == text {
			return i
		}
	}
	t.Fatalf("%s not found", text)
	return -1
}

func requireErr(t *testing.T, s *Schedule, sentinel error, want ...string) {
	t.Helper()
	_, err := Simulate(s, UnitCost)
	require.Error(t, err)
	require.ErrorIs(t, err, sentinel, err.Error())
	for _, w := range want {
		assert.Contains(t, err.Error(), w)
	}
}

// Rank 1 receiving microbatch 1 before microbatch 0 cannot run 1F0 (its
// input arrives later in its own list), so it never sends 1sb0>r0, which
// rank 0 waits for: both ranks are stuck, and the error says where.
func TestSwappedReceivesDeadlock(t *testing.T) {
	s := valid1F1B(t)
	r1 := s.Actions[1]
	i, j := find(t, r1, "1rf0<r0"), find(t, r1, "1rf1<r0")
	r1[i], r1[j] = r1[j], r1[i]
	requireErr(t, s, ErrDeadlock,
		"rank 0 waits at 0rb0<r1", "needs 1sb0>r0 on rank 1",
		"rank 1 waits at 1F0", "needs 1rf0<r0 later in rank 1's own list")
}

// Swapping the first two backward receives on rank 0 against a 1F1B peer
// that sends them in order is a cycle across ranks.
func TestCrossRankCycleDeadlock(t *testing.T) {
	s := valid1F1B(t)
	r0 := s.Actions[0]
	// Move 0B0's receive after 0B1: 0B0 then waits for 0rb0<r1 which now
	// follows it in rank 0's list.
	i := find(t, r0, "0rb0<r1")
	a := r0[i]
	r0 = slices.Delete(r0, i, i+1)
	k := find(t, r0, "0B1")
	s.Actions[0] = slices.Insert(r0, k+1, a)
	requireErr(t, s, ErrDeadlock, "rank 0 waits at 0B0", "0rb0<r1")
}

func TestDroppedSendIsUnmatched(t *testing.T) {
	s := valid1F1B(t)
	i := find(t, s.Actions[0], "0sf2>r1")
	s.Actions[0] = slices.Delete(s.Actions[0], i, i+1)
	requireErr(t, s, ErrUnmatched, "rank 1", "1rf2<r0", "0sf2>r1", "rank 0")
}

func TestDroppedRecvIsUnmatched(t *testing.T) {
	s := valid1F1B(t)
	i := find(t, s.Actions[0], "0rb3<r1")
	s.Actions[0] = slices.Delete(s.Actions[0], i, i+1)
	requireErr(t, s, ErrUnmatched, "rank 1: 1sb3>r0 has no matching receive 0rb3<r1 on rank 0")
}

func TestDroppedPairIsMissing(t *testing.T) {
	s := valid1F1B(t)
	i := find(t, s.Actions[0], "0sf1>r1")
	s.Actions[0] = slices.Delete(s.Actions[0], i, i+1)
	j := find(t, s.Actions[1], "1rf1<r0")
	s.Actions[1] = slices.Delete(s.Actions[1], j, j+1)
	requireErr(t, s, ErrMissing, "0sf1>r1", "1rf1<r0", "rank 0", "rank 1")
}

func TestMismatchedPeer(t *testing.T) {
	s, err := OneFOneB(3, 3)
	require.NoError(t, err)
	i := find(t, s.Actions[0], "0sf1>r1")
	s.Actions[0][i].Peer = 2
	requireErr(t, s, ErrUnmatched, "mismatched peer", "rank 0", "0sf1>r2", "rank 1")
}

func TestWrongRank(t *testing.T) {
	s := valid1F1B(t)
	// Put an F of chunk 0 on rank 1.
	i := find(t, s.Actions[0], "0F3")
	a := s.Actions[0][i]
	s.Actions[0] = slices.Delete(s.Actions[0], i, i+1)
	s.Actions[1] = slices.Insert(s.Actions[1], 0, a)
	requireErr(t, s, ErrInvalid, "wrong rank", "0F3 is on rank 1", "chunk 0 lives on rank 0")
}

func TestMissingMicrobatch(t *testing.T) {
	s := valid1F1B(t)
	// Remove every trace of microbatch 3 on rank 1 (recv, F, B, send): the
	// microbatch's chunk-1 work never runs.
	s.Actions[1] = slices.DeleteFunc(s.Actions[1], func(a Action) bool {
		return a.Micro == 3 && a.Kind <= RecvB
	})
	requireErr(t, s, ErrMissing, "1F3 never runs", "rank 1")
}

func TestDuplicate(t *testing.T) {
	s := valid1F1B(t)
	i := find(t, s.Actions[1], "1B2")
	s.Actions[1] = slices.Insert(s.Actions[1], i, s.Actions[1][i])
	requireErr(t, s, ErrInvalid, "duplicate", "rank 1", "1B2")
}

func TestBBeforeF(t *testing.T) {
	s := valid1F1B(t)
	r1 := s.Actions[1]
	i, j := find(t, r1, "1F1"), find(t, r1, "1B1")
	r1[i], r1[j] = r1[j], r1[i]
	requireErr(t, s, ErrInvalid, "B before F", "rank 1", "1B1", "1F1")
}

func TestWBeforeB(t *testing.T) {
	s, err := ZeroBubble(2, 2)
	require.NoError(t, err)
	r0 := s.Actions[0]
	i, j := find(t, r0, "0B1"), find(t, r0, "0W1")
	r0[i], r0[j] = r0[j], r0[i]
	requireErr(t, s, ErrInvalid, "W before B", "0W1")
}

func TestMissingW(t *testing.T) {
	s, err := ZeroBubble(2, 2)
	require.NoError(t, err)
	i := find(t, s.Actions[1], "1W0")
	s.Actions[1] = slices.Delete(s.Actions[1], i, i+1)
	requireErr(t, s, ErrMissing, "1W0 never runs")
}

func TestSendWithinRank(t *testing.T) {
	s, err := Interleaved(1, 2, 1)
	require.NoError(t, err)
	s.Actions[0] = slices.Insert(s.Actions[0], 1, Action{Kind: SendF, Chunk: 0, Micro: 0, Peer: 0})
	requireErr(t, s, ErrInvalid, "same rank", "0sf0>r0")
}

func TestSendFromLastChunk(t *testing.T) {
	s := valid1F1B(t)
	s.Actions[1] = slices.Insert(s.Actions[1], 0, Action{Kind: SendF, Chunk: 1, Micro: 0, Peer: 0})
	requireErr(t, s, ErrInvalid, "1sf0>r0", "no neighbour")
}

func TestOutOfRange(t *testing.T) {
	s := valid1F1B(t)
	s.Actions[0][0].Micro = 9
	requireErr(t, s, ErrInvalid, "microbatch 9 out of range")
	s = valid1F1B(t)
	s.Actions[0][0].Chunk = -2
	requireErr(t, s, ErrInvalid, "chunk -2 out of range")
}

func TestSyncOptRules(t *testing.T) {
	s := valid1F1B(t)
	s.Actions[1] = s.Actions[1][:len(s.Actions[1])-2]
	requireErr(t, s, ErrMissing, "rank 1", "sync/opt")

	s = valid1F1B(t)
	n := len(s.Actions[0])
	s.Actions[0][n-2], s.Actions[0][n-1] = s.Actions[0][n-1], s.Actions[0][n-2]
	requireErr(t, s, ErrInvalid, "opt", "before sync")

	s = valid1F1B(t)
	i := find(t, s.Actions[0], "0B3")
	s.Actions[0] = slices.Insert(s.Actions[0], i, Action{Kind: GradSync})
	requireErr(t, s, ErrInvalid, "after its sync")
}

func TestShapeMismatch(t *testing.T) {
	s := valid1F1B(t)
	s.Actions = s.Actions[:1]
	requireErr(t, s, ErrInvalid, "p=2 but 1 lists")
}

// Parse accepts a broken schedule so that Simulate can say what is wrong.
func TestParseThenDiagnose(t *testing.T) {
	text := "schedule custom p=2 v=1 m=1\n" +
		"rank 0: 0rb0<r1 0F0 0sf0>r1 0B0 sync opt\n" +
		"rank 1: 1rf0<r0 1F0 1B0 1sb0>r0 sync opt\n"
	s, err := Parse(text)
	require.NoError(t, err)
	requireErr(t, s, ErrDeadlock, "rank 0 waits at 0rb0<r1", "rank 1 waits at 1rf0<r0", "needs 0sf0>r1 on rank 0")
}

func TestHugeHeaderIsRejectedCheaply(t *testing.T) {
	s, err := Parse("schedule x p=1 v=1000000000 m=1000000000\nrank 0: 0F0 0B0 sync opt\n")
	require.NoError(t, err)
	requireErr(t, s, ErrMissing, "p·v·m")
	_, err = Parse("schedule x p=4000000000000 v=1 m=1\nrank 0:\n")
	require.ErrorIs(t, err, ErrParse)
}
