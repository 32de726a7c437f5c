package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/dist"
)

// twoHosts is two "machines" on one: network namespaces joined by a veth
// pair with private test addresses, each with its own /etc/hosts (ip
// netns exec mounts /etc/netns/NAME/hosts over /etc/hosts). Everything
// is made for the test and removed after it.
type twoHosts struct {
	ns   [2]string // namespace names
	addr [2]string // each one's address on the link
	name [2]string // each one's hostname in the hosts files
}

// newTwoHosts makes the namespaces, or skips the test, saying why, where
// they cannot be made (not root, no ip, no right to make namespaces).
// Host 0 maps its own name to 127.0.1.1, as Debian's and Ubuntu's
// installers write it; host 1 maps host 0's name to its real address.
func newTwoHosts(t *testing.T) *twoHosts {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to make network namespaces")
	}
	id := os.Getpid() % 10000
	h := &twoHosts{
		ns:   [2]string{fmt.Sprintf("gc%d-a", id), fmt.Sprintf("gc%d-b", id)},
		addr: [2]string{fmt.Sprintf("10.213.%d.1", id%250), fmt.Sprintf("10.213.%d.2", id%250)},
		name: [2]string{fmt.Sprintf("gcnode%d-0", id), fmt.Sprintf("gcnode%d-1", id)},
	}
	veth := [2]string{fmt.Sprintf("gcv%d-a", id), fmt.Sprintf("gcv%d-b", id)}
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("netns", "add", h.ns[0]); err != nil {
		t.Skipf("cannot make a network namespace here: %v", err)
	}
	t.Cleanup(func() {
		for _, ns := range h.ns {
			run("netns", "del", ns) // takes its end of the veth pair along
			os.RemoveAll(filepath.Join("/etc/netns", ns))
		}
	})
	require.NoError(t, run("netns", "add", h.ns[1]))
	require.NoError(t, run("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]))
	hosts := [2]string{
		fmt.Sprintf("127.0.0.1 localhost\n127.0.1.1 %s\n%s %s\n", h.name[0], h.addr[1], h.name[1]),
		fmt.Sprintf("127.0.0.1 localhost\n127.0.1.1 %s\n%s %s\n", h.name[1], h.addr[0], h.name[0]),
	}
	for i, ns := range h.ns {
		require.NoError(t, run("link", "set", veth[i], "netns", ns))
		require.NoError(t, run("-n", ns, "addr", "add", h.addr[i]+"/24", "dev", veth[i]))
		require.NoError(t, run("-n", ns, "link", "set", veth[i], "up"))
		require.NoError(t, run("-n", ns, "link", "set", "lo", "up"))
		dir := filepath.Join("/etc/netns", ns)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts[i]), 0o644))
	}
	return h
}

// start runs one process of a job of one process per host on host i, as
// a launcher on each machine would: torchrun's variables, the master
// given by its hostname.
func (h *twoHosts) start(t *testing.T, i, port int, args []string, env ...string) *proc {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	full := append([]string{"netns", "exec", h.ns[i], self}, args...)
	e := append(childEnv(i, 2, port, "netns-secret"), asMainEnv+"=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR="+h.name[0])
	return startProc(t, "ip", full, append(e, env...))
}

// A job across two machines whose master maps its own name to 127.0.1.1
// (the master given by hostname, as SLURM's node list and most sbatch
// scripts give it) trains dp2 bit for bit as one process: rank 0's
// transport advertises the address the other machine reached it at,
// not loopback. A loopback --advertise-addr in such a job is refused,
// saying what to set.
func TestJobAcrossTwoHostsWithHostnameOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	h := newTwoHosts(t)
	plan := []string{"--devices", "2", "--dp", "2"}
	port := 29400 + os.Getpid()%500
	dir := t.TempDir()
	args := jobArgs(t, dir, plan...)
	ps := []*proc{h.start(t, 0, port, args), h.start(t, 1, port, jobArgs(t, t.TempDir(), plan...))}
	waitAll(t, ps, 3*time.Minute)
	for r, p := range ps {
		require.NoError(t, p.err, "rank %d:\n%s", r, p.output())
	}
	assertMatchesOneProcess(t, plan, 2, dir)

	ps = []*proc{
		h.start(t, 0, port+1, args, "GCOMPILE_ADVERTISE_ADDR=127.0.0.1"),
		h.start(t, 1, port+1, jobArgs(t, t.TempDir(), plan...)),
	}
	start := time.Now()
	waitAll(t, ps, time.Minute)
	require.Less(t, time.Since(start), 15*time.Second, "refused at once, not after a timeout")
	require.Error(t, ps[0].err)
	require.Contains(t, ps[0].output(), "a loopback address (from --advertise-addr or GCOMPILE_ADVERTISE_ADDR), but the job spans machines (LOCAL_WORLD_SIZE 1 < WORLD_SIZE 2)")
	require.Error(t, ps[1].err, "rank 1 stops too:\n%s", ps[1].output())
}

// A token derived from public facts is a note on one machine and a
// warning with the fix for a job across machines, where anyone who can
// reach the master could compute it.
func TestDerivedTokenWarnsAcrossMachines(t *testing.T) {
	one := derivedTokenNote(dist.World{Size: 4, LocalSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29500})
	assert.NotContains(t, one, "WARNING")
	assert.Contains(t, one, "set GCOMPILE_TOKEN or --token for a secret one")
	many := derivedTokenNote(dist.World{Size: 16, LocalSize: 8, MasterAddr: "node0", MasterPort: 10042, Launcher: "slurm", JobID: "42"})
	assert.True(t, strings.HasPrefix(many, "WARNING: this job spans several machines"), many)
	assert.Contains(t, many, "node0:10042")
	assert.Contains(t, many, "export GCOMPILE_TOKEN=")
}
