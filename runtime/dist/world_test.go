package dist

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	slurm := func(extra map[string]string) map[string]string {
		m := map[string]string{
			"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
			"SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x4)",
			"SLURM_JOB_NODELIST": "node[001-004]", "SLURM_JOB_ID": "123456",
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name string
		env  map[string]string
		want World
	}{
		{
			name: "no launcher",
			env:  map[string]string{},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500},
		},
		{
			name: "no launcher, MASTER_PORT",
			env:  map[string]string{"MASTER_PORT": "31000"},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 31000},
		},
		{
			name: "torchrun",
			env: map[string]string{
				"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
				"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
				"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "abc",
			},
			want: World{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, MasterAddr: "10.0.0.1", MasterPort: 29400,
				Launcher: "torchrun", AgentStore: true, JobID: "abc"},
		},
		{
			name: "torchrun without LOCAL_* or port",
			env:  map[string]string{"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "TORCHELASTIC_USE_AGENT_STORE": "False"},
			want: World{Rank: 2, Size: 3, LocalRank: 2, LocalSize: 3, MasterAddr: "h", MasterPort: 29500, Launcher: "torchrun"},
		},
		{
			name: "torchrun alone without master",
			env:  map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Launcher: "torchrun"},
		},
		{
			name: "torchrun under SLURM",
			env: slurm(map[string]string{
				"RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8",
				"MASTER_ADDR": "node001", "MASTER_PORT": "29500", "SLURM_STEP_ID": "0",
			}),
			want: World{Rank: 0, Size: 16, LocalRank: 0, LocalSize: 8, MasterAddr: "node001", MasterPort: 29500,
				Launcher: "torchrun", JobID: "123456.0"},
		},
		{
			name: "open mpi on one node",
			env: map[string]string{
				"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
				"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
			},
			want: World{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, Launcher: "mpi"},
		},
		{
			name: "open mpi with job id derives the port",
			env: map[string]string{
				"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
				"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
				"OMPI_MCA_ess_base_jobid": "3418554369",
			},
			want: World{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, MasterAddr: "127.0.0.1",
				MasterPort: derivedPort("3418554369"), Launcher: "mpi", JobID: "3418554369"},
		},
		{
			name: "open mpi across nodes with MASTER_ADDR",
			env: map[string]string{
				"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
				"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
				"MASTER_ADDR": "gpu1", "MASTER_PORT": "4000",
			},
			want: World{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, MasterAddr: "gpu1", MasterPort: 4000, Launcher: "mpi"},
		},
		{
			name: "slurm compressed tasks per node",
			env:  slurm(nil),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 2, MasterAddr: "node001",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm uneven nodes, last node",
			env:  slurm(map[string]string{"SLURM_NTASKS": "7", "SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "2(x3),1"}),
			want: World{Rank: 6, Size: 7, LocalRank: 0, LocalSize: 1, MasterAddr: "node001",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm NTASKS_PER_NODE wins over TASKS_PER_NODE",
			env:  slurm(map[string]string{"SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "garbage("}),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, MasterAddr: "node001",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm step layout wins over the allocation's",
			env:  slurm(map[string]string{"SLURM_STEP_TASKS_PER_NODE": "1(x2),3(x2)", "SLURM_NTASKS_PER_NODE": "8"}),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 3, MasterAddr: "node001",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm plain tasks per node ignores node id",
			env:  slurm(map[string]string{"SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": ""}),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 2, MasterAddr: "node001",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm step nodelist first, step id in job id",
			env: slurm(map[string]string{
				"SLURM_STEP_NODELIST": "rack[1-2]-n[3-4],gpu5", "SLURM_NODELIST": "x",
				"SLURM_STEP_ID": "2",
			}),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 2, MasterAddr: "rack1-n3",
				MasterPort: 10000 + 123456%20000, Launcher: "slurm", JobID: "123456.2"},
		},
		{
			name: "slurm MASTER_ADDR and MASTER_PORT win",
			env:  slurm(map[string]string{"MASTER_ADDR": "head", "MASTER_PORT": "1234"}),
			want: World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 2, MasterAddr: "head", MasterPort: 1234,
				Launcher: "slurm", JobID: "123456"},
		},
		{
			name: "slurm old NODELIST only, no job id",
			env: map[string]string{
				"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
				"SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "a,b",
			},
			want: World{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 1, MasterAddr: "a", MasterPort: 29500, Launcher: "slurm"},
		},
		{
			name: "slurm batch step of one task",
			env:  map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Launcher: "slurm"},
		},
		{
			// sbatch's script without --ntasks, and salloc's shell: alone.
			name: "a batch script's own process",
			env:  map[string]string{"SLURM_PROCID": "0"},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500},
		},
		{
			name: "an allocation's shell",
			env:  map[string]string{"SLURM_NTASKS": "8"},
			want: World{Size: 1, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := FromEnv(envOf(tc.env))
			require.NoError(t, err)
			assert.Equal(t, tc.want, w)
		})
	}
}

func TestFromEnvErrors(t *testing.T) {
	mpi := map[string]string{
		"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
		"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
	}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	slurm := map[string]string{
		"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
		"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "n[1-2]",
	}
	torch := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"rank not a number", with(torch, "RANK", "x"), `RANK="x": not an integer`},
		{"negative rank", with(torch, "RANK", "-1"), `RANK=-1: must be at least 0`},
		{"rank too large", with(torch, "RANK", "2"), `RANK 2 is not below WORLD_SIZE 2`},
		{"zero world", with(torch, "WORLD_SIZE", "0"), `WORLD_SIZE=0: must be at least 1`},
		{"world past the devices a job can have", with(torch, "WORLD_SIZE", "2147483648"), `world size 2147483648: a job has at most 1048576 processes`},
		{"rank without world size", map[string]string{"RANK": "1"}, `RANK="1" is set but WORLD_SIZE is not`},
		{"world size without rank", map[string]string{"WORLD_SIZE": "2"}, `WORLD_SIZE="2" is set but RANK is not`},
		{"mpi rank without size", map[string]string{"OMPI_COMM_WORLD_RANK": "1"}, `OMPI_COMM_WORLD_RANK="1" is set but OMPI_COMM_WORLD_SIZE is not: mpirun sets both`},
		{"mpi size without rank", map[string]string{"OMPI_COMM_WORLD_SIZE": "2"}, `OMPI_COMM_WORLD_SIZE="2" is set but OMPI_COMM_WORLD_RANK is not`},
		{"slurm task 1 without its count", map[string]string{"SLURM_PROCID": "1"}, `SLURM_PROCID="1" is set but SLURM_NTASKS is not: srun sets both`},
		{"torchrun without master", map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, `MASTER_ADDR is not set`},
		{"bad port", with(torch, "MASTER_PORT", "http"), `MASTER_PORT="http": not an integer`},
		{"port out of range", with(torch, "MASTER_PORT", "70000"), `MASTER_PORT=70000: not a port (1..65535)`},
		{"port zero", with(torch, "MASTER_PORT", "0"), `MASTER_PORT=0: must be at least 1`},
		{"bad agent store flag", with(torch, "TORCHELASTIC_USE_AGENT_STORE", "maybe"), `TORCHELASTIC_USE_AGENT_STORE="maybe": not True or False`},
		{"local rank too large", with(torch, "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2"), `LOCAL_RANK 2 is not below LOCAL_WORLD_SIZE 2`},
		{"local size above size", with(torch, "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "3"), `local size 3 is not in [1, 2]`},
		{"mpi across nodes without master", mpi, `set MASTER_ADDR (or pass --master-addr)`},
		{"mpi without local rank", with(mpi, "OMPI_COMM_WORLD_LOCAL_RANK", ""), `OMPI_COMM_WORLD_LOCAL_RANK is not set`},
		{"mpi bad rank", with(mpi, "OMPI_COMM_WORLD_RANK", "one"), `OMPI_COMM_WORLD_RANK="one": not an integer`},
		{"slurm procid too large", with(slurm, "SLURM_PROCID", "4"), `SLURM_PROCID 4 is not below SLURM_NTASKS 4`},
		{"slurm bad tasks per node", with(slurm, "SLURM_TASKS_PER_NODE", "2(x"), `SLURM_TASKS_PER_NODE "2(x" is not Slurm's tasks-per-node form`},
		{"slurm tasks per node zero", with(slurm, "SLURM_TASKS_PER_NODE", "0"), `SLURM_TASKS_PER_NODE "0" is not Slurm's tasks-per-node form`},
		{"slurm node id beyond list", with(slurm, "SLURM_NODEID", "2"), `SLURM_NODEID 2 is not below the 2 nodes of SLURM_TASKS_PER_NODE="2(x2)"`},
		{"slurm no node id", with(slurm, "SLURM_NODEID", ""), `SLURM_NODEID is not set`},
		{"slurm local id too large", with(slurm, "SLURM_LOCALID", "2"), `SLURM_LOCALID 2 is not below this node's task count 2`},
		{"slurm no local id", with(slurm, "SLURM_LOCALID", ""), `SLURM_LOCALID is not set`},
		{"slurm no tasks per node", with(slurm, "SLURM_TASKS_PER_NODE", ""), `cannot tell how many tasks share this node`},
		{"slurm bad nodelist", with(slurm, "SLURM_JOB_NODELIST", "n[1-"), `SLURM_JOB_NODELIST "n[1-" is not a Slurm hostlist`},
		{"slurm no nodelist", with(slurm, "SLURM_JOB_NODELIST", ""), `none of MASTER_ADDR, SLURM_STEP_NODELIST`},
		{"slurm bad job id", with(slurm, "SLURM_JOB_ID", "12a"), `SLURM_JOB_ID="12a": not a job number`},
		{"no launcher bad port", map[string]string{"MASTER_PORT": "-5"}, `MASTER_PORT=-5: must be at least 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromEnv(envOf(tc.env))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestWorldValidateAndString(t *testing.T) {
	w := World{Rank: 1, Size: 4, LocalRank: 1, LocalSize: 2, MasterAddr: "10.0.0.1", MasterPort: 29500, Launcher: "torchrun"}
	require.NoError(t, w.Validate())
	assert.Equal(t, "rank 1 of 4 (local 1 of 2) via torchrun, master 10.0.0.1:29500", w.String())
	assert.Equal(t, "rank 0 of 1 (local 0 of 1) without a launcher, master [::1]:7",
		World{Size: 1, LocalSize: 1, MasterAddr: "::1", MasterPort: 7}.String())

	bad := []struct {
		w    World
		want string
	}{
		{World{Size: 0}, "world size 0"},
		{World{Rank: 4, Size: 4, LocalSize: 1, MasterAddr: "h", MasterPort: 1}, "rank 4 is not in [0, 4)"},
		{World{Rank: -1, Size: 4, LocalSize: 1, MasterAddr: "h", MasterPort: 1}, "rank -1"},
		{World{Size: 2, LocalSize: 3, MasterAddr: "h", MasterPort: 1}, "local size 3"},
		{World{Size: 2, LocalRank: 1, LocalSize: 1, MasterAddr: "h", MasterPort: 1}, "local rank 1"},
		{World{Size: 2, LocalSize: 1, MasterPort: 1}, "master address is empty"},
		{World{Size: 2, LocalSize: 1, MasterAddr: "h", MasterPort: 0}, "master port 0"},
		{World{Size: 2, LocalSize: 1, MasterAddr: "h", MasterPort: 65536}, "master port 65536"},
	}
	for _, tc := range bad {
		err := tc.w.Validate()
		require.Error(t, err, "%+v", tc.w)
		assert.Contains(t, err.Error(), tc.want)
	}
	assert.Equal(t, 29500, w.StorePort())
	w.AgentStore = true
	assert.Equal(t, 29501, w.StorePort(), "torchrun's agent holds the master port")
	w.MasterPort = 65535
	assert.Equal(t, 65534, w.StorePort())

	// One process needs no rendezvous, so no address.
	assert.NoError(t, World{Size: 1, LocalSize: 1}.Validate())
}

func TestDefaultToken(t *testing.T) {
	w := World{Rank: 1, Size: 2, LocalSize: 2, MasterAddr: "h", MasterPort: 29500, Launcher: "slurm", JobID: "42"}
	tok, secret := DefaultToken(w, envOf(map[string]string{"GCOMPILE_TOKEN": "s3cret"}))
	assert.Equal(t, "s3cret", tok)
	assert.True(t, secret)

	tok, secret = DefaultToken(w, envOf(nil))
	assert.False(t, secret)
	assert.Len(t, tok, 32)
	assert.Regexp(t, "^[0-9a-f]{32}$", tok)

	// Every rank of the job derives the same token...
	other := w
	other.Rank, other.LocalRank = 0, 1
	tok0, _ := DefaultToken(other, envOf(nil))
	assert.Equal(t, tok, tok0)
	// ...and another job, or the same job id at another port, does not.
	for _, change := range []func(*World){
		func(w *World) { w.JobID = "43" },
		func(w *World) { w.MasterPort = 29501 },
		func(w *World) { w.MasterAddr = "g" },
		func(w *World) { w.Launcher = "mpi" },
	} {
		o := w
		change(&o)
		t2, _ := DefaultToken(o, envOf(nil))
		assert.NotEqual(t, tok, t2)
	}
}

func TestTasksPerNode(t *testing.T) {
	good := []struct {
		in   string
		want []nodeTasks
	}{
		{"4", []nodeTasks{{4, 1}}},
		{"2(x3),1", []nodeTasks{{2, 3}, {1, 1}}},
		{"1,2(x2),3", []nodeTasks{{1, 1}, {2, 2}, {3, 1}}},
		{"1(x999999999)", []nodeTasks{{1, 999999999}}},
	}
	for _, tc := range good {
		got, err := parseTasksPerNode(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, in := range []string{"", "2(x", "2(3)", "2(x0)", "x", "2,,1", "-1", "2(x3)1", " 2", "2(x3),", "99999999999999999999"} {
		_, err := parseTasksPerNode(in)
		assert.Error(t, err, "%q", in)
	}
}

func TestFirstHost(t *testing.T) {
	good := []struct{ in, want string }{
		{"node[001-004,007],gpu5", "node001"},
		{"a,b", "a"},
		{"a", "a"},
		{"rack[1-2]-n[3-4]", "rack1-n3"},
		{"rack[1-2]-n[3-4],x[1-3]", "rack1-n3"},
		{"gpu[7,2-3]", "gpu7"},
		{"n[09-11]", "n09"},
		{"host.example.com", "host.example.com"},
		{"[1-2]x", "1x"},
	}
	for _, tc := range good {
		got, err := firstHost(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, in := range []string{"node[1-", "node]1", "n[]", "n[a-b]", "n[3-1]", "a,,b", "a,", ",a", "n[1-2[3]]", "n[1--2]", "a b"} {
		_, err := firstHost(in)
		assert.Error(t, err, "%q", in)
	}
}
