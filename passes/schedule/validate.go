package schedule

import "fmt"

// Validate checks the rules that can be decided without running the
// schedule: shapes and ranges, placement (chunk j on rank j mod p), no
// duplicated or missing (chunk, microbatch) work, backward after forward on a
// rank, transfers only across rank boundaries with peers that agree, and one
// trailing sync and opt per rank. Ordering problems between ranks (who waits
// for whom) are left to Simulate, which can name the cycle.
func (s *Schedule) Validate() error {
	_, err := s.index()
	return err
}

// positions records, for every kind and (chunk, micro), where the action sits
// in its rank's list (index+1; 0 when absent). The rank itself is implied by
// the chunk once placement has been checked.
type positions struct {
	at    [GradSync][]int32
	micro int
}

func (ps *positions) get(k Kind, chunk, micro int) int32 { return ps.at[k][chunk*ps.micro+micro] }

func (s *Schedule) index() (*positions, error) {
	p, v, m := s.Ranks, s.Chunks, s.Micro
	if p < 1 || v < 1 || m < 1 {
		return nil, fmt.Errorf("%w: p, v and m must all be ≥ 1, got p=%d v=%d m=%d", ErrInvalid, p, v, m)
	}
	if len(s.Actions) != p {
		return nil, fmt.Errorf("%w: one action list per rank: p=%d but %d lists", ErrInvalid, p, len(s.Actions))
	}
	// Every (chunk, micro) needs an F and a B, so a list shorter than
	// 2·p·v·m is incomplete; saying so up front also keeps a hostile header
	// (p=v=m=10⁹) from sizing the index below.
	total := 0
	for _, acts := range s.Actions {
		total += len(acts)
	}
	if need := 2 * float64(p) * float64(v) * float64(m); need > float64(total) {
		return nil, fmt.Errorf("%w: p=%d v=%d m=%d needs an F and a B for each of p·v·m = %.0f (chunk, microbatch) pairs, but the schedule has only %d actions", ErrMissing, p, v, m, need/2, total)
	}
	nc := p * v
	ps := &positions{micro: m}
	for k := range ps.at {
		ps.at[k] = make([]int32, nc*m)
	}
	for r, acts := range s.Actions {
		syncAt, optAt := -1, -1
		for i, a := range acts {
			switch {
			case a.Kind == GradSync:
				if syncAt >= 0 {
					return nil, fmt.Errorf("%w: rank %d has a second sync at position %d (one gradient sync per step)", ErrInvalid, r, i)
				}
				syncAt = i
				continue
			case a.Kind == Optim:
				if optAt >= 0 {
					return nil, fmt.Errorf("%w: rank %d has a second opt at position %d (one optimizer step per step)", ErrInvalid, r, i)
				}
				if syncAt < 0 {
					return nil, fmt.Errorf("%w: rank %d runs opt at position %d before sync (gradients must be synced before the optimizer step)", ErrInvalid, r, i)
				}
				optAt = i
				continue
			case a.Kind >= numKinds:
				return nil, fmt.Errorf("%w: rank %d position %d: unknown action kind %d", ErrInvalid, r, i, a.Kind)
			}
			if a.Chunk < 0 || a.Chunk >= nc {
				return nil, fmt.Errorf("%w: rank %d position %d: %s: chunk %d out of range (p·v = %d chunks)", ErrInvalid, r, i, a, a.Chunk, nc)
			}
			if a.Micro < 0 || a.Micro >= m {
				return nil, fmt.Errorf("%w: rank %d position %d: %s: microbatch %d out of range (m = %d)", ErrInvalid, r, i, a, a.Micro, m)
			}
			if owner := a.Chunk % p; owner != r {
				return nil, fmt.Errorf("%w: wrong rank: %s is on rank %d but chunk %d lives on rank %d (chunk j lives on rank j mod p)", ErrInvalid, a, r, a.Chunk, owner)
			}
			if syncAt >= 0 && a.Kind <= W {
				return nil, fmt.Errorf("%w: rank %d runs %s after its sync (all compute must precede the gradient sync)", ErrInvalid, r, a)
			}
			if err := s.checkTransfer(r, a); err != nil {
				return nil, err
			}
			slot := &ps.at[a.Kind][a.Chunk*m+a.Micro]
			if *slot != 0 {
				return nil, fmt.Errorf("%w: duplicate: rank %d runs %s at positions %d and %d (each action once per step)", ErrInvalid, r, a, *slot-1, i)
			}
			*slot = int32(i + 1)
		}
		if syncAt < 0 || optAt < 0 {
			return nil, fmt.Errorf("%w: rank %d lacks its trailing sync/opt (every rank ends the step with one sync then one opt)", ErrMissing, r)
		}
	}
	if err := s.checkCoverage(ps); err != nil {
		return nil, err
	}
	if err := s.checkPairs(ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// checkTransfer checks that a send or receive crosses a real rank boundary in
// the right direction and names the rank that holds the neighbouring chunk.
func (s *Schedule) checkTransfer(r int, a Action) error {
	var nb int // neighbouring chunk whose rank is the peer
	switch a.Kind {
	case SendF, RecvB:
		nb = a.Chunk + 1
	case RecvF, SendB:
		nb = a.Chunk - 1
	default:
		return nil
	}
	if nb < 0 || nb >= s.numChunks() {
		return fmt.Errorf("%w: rank %d: %s: chunk %d has no neighbour chunk %d (the first chunk has no input to receive, the last sends no output)", ErrInvalid, r, a, a.Chunk, nb)
	}
	want := s.RankOf(nb)
	if want == r {
		return fmt.Errorf("%w: rank %d: %s: chunks %d and %d share rank %d, so data passes locally (no send/recv between chunks on the same rank)", ErrInvalid, r, a, a.Chunk, nb, r)
	}
	if a.Peer != want {
		return fmt.Errorf("%w: mismatched peer: rank %d: %s names rank %d but chunk %d lives on rank %d", ErrUnmatched, r, a, a.Peer, nb, want)
	}
	return nil
}

// checkCoverage: every (chunk, micro) runs F and B exactly once, B after F;
// W is all-or-nothing (only zero-bubble schedules split it off) and after B.
func (s *Schedule) checkCoverage(ps *positions) error {
	nc, m := s.numChunks(), s.Micro
	nW := 0
	for _, x := range ps.at[W] {
		if x != 0 {
			nW++
		}
	}
	for j := 0; j < nc; j++ {
		r := s.RankOf(j)
		for k := 0; k < m; k++ {
			f, b, w := ps.get(F, j, k), ps.get(B, j, k), ps.get(W, j, k)
			switch {
			case f == 0:
				return fmt.Errorf("%w: %s never runs: microbatch %d has no forward of chunk %d on rank %d (every (chunk, microbatch) runs F and B once)", ErrMissing, Action{Kind: F, Chunk: j, Micro: k}, k, j, r)
			case b == 0:
				return fmt.Errorf("%w: %s never runs: microbatch %d has no backward of chunk %d on rank %d (every (chunk, microbatch) runs F and B once)", ErrMissing, Action{Kind: B, Chunk: j, Micro: k}, k, j, r)
			case b < f:
				return fmt.Errorf("%w: B before F: rank %d runs %s at position %d before %s at position %d", ErrInvalid, r, Action{Kind: B, Chunk: j, Micro: k}, b-1, Action{Kind: F, Chunk: j, Micro: k}, f-1)
			case nW > 0 && w == 0:
				return fmt.Errorf("%w: %s never runs: the schedule splits W off B, so every (chunk, microbatch) needs one W (rank %d)", ErrMissing, Action{Kind: W, Chunk: j, Micro: k}, r)
			case w != 0 && w < b:
				return fmt.Errorf("%w: W before B: rank %d runs %s at position %d before %s at position %d", ErrInvalid, r, Action{Kind: W, Chunk: j, Micro: k}, w-1, Action{Kind: B, Chunk: j, Micro: k}, b-1)
			}
		}
	}
	return nil
}

// checkPairs matches every send with its receive across each boundary between
// chunks on different ranks, and requires the pair to exist at all: the
// receiving chunk has no other way to get its input (or output gradient).
func (s *Schedule) checkPairs(ps *positions) error {
	nc, m := s.numChunks(), s.Micro
	for j := 0; j+1 < nc; j++ {
		lo, hi := s.RankOf(j), s.RankOf(j+1)
		if lo == hi {
			continue
		}
		for k := 0; k < m; k++ {
			send := Action{Kind: SendF, Chunk: j, Micro: k, Peer: hi}
			recv := Action{Kind: RecvF, Chunk: j + 1, Micro: k, Peer: lo}
			if err := pairError(ps.get(SendF, j, k) != 0, ps.get(RecvF, j+1, k) != 0, send, lo, recv, hi, "input of"); err != nil {
				return err
			}
			send = Action{Kind: SendB, Chunk: j + 1, Micro: k, Peer: lo}
			recv = Action{Kind: RecvB, Chunk: j, Micro: k, Peer: hi}
			if err := pairError(ps.get(SendB, j+1, k) != 0, ps.get(RecvB, j, k) != 0, send, hi, recv, lo, "output gradient of"); err != nil {
				return err
			}
		}
	}
	return nil
}

func pairError(hasSend, hasRecv bool, send Action, sendRank int, recv Action, recvRank int, what string) error {
	switch {
	case hasSend && hasRecv:
		return nil
	case hasSend:
		return fmt.Errorf("%w: rank %d: %s has no matching receive %s on rank %d", ErrUnmatched, sendRank, send, recv, recvRank)
	case hasRecv:
		return fmt.Errorf("%w: rank %d: %s has no matching send %s on rank %d", ErrUnmatched, recvRank, recv, send, sendRank)
	}
	return fmt.Errorf("%w: the %s chunk %d, microbatch %d never crosses from rank %d to rank %d: neither %s on rank %d nor %s on rank %d exists",
		ErrMissing, what, recv.Chunk, recv.Micro, sendRank, recvRank, send, sendRank, recv, recvRank)
}
