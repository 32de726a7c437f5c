package cost

// PublishedRun is a measured training run from the literature: a model's
// shape, the parallel configuration the authors ran, and what they
// measured. The cost model is checked against these runs afterwards
// (cost.TestPublishedRuns, planner.TestPlannerBeatsPublished); nothing in
// the model is fitted to them.
type PublishedRun struct {
	Source string // paper and table
	Name   string // the paper's name for the model
	Shape  Transformer
	GPUs   int
	// The authors' configuration. MicroBatch and VPP are the papers' own
	// where they state them; where they do not (Narayanan et al.'s Table 1)
	// they are the choice stated in Assumed, made before comparing.
	TP, PP, VPP, Batch, MicroBatch int
	SequenceParallel               bool
	Recompute                      string // full or selective
	// What was measured: the iteration time in seconds (0 when the paper
	// gives only throughput), the throughput per GPU in TFLOP/s in the
	// paper's FLOPs convention (PaperFLOPs), the model FLOPs utilisation
	// (0 when not given).
	StepSeconds, TFLOPSPerGPU, MFU float64
	// Checked says where the row's figures were confirmed in a source
	// found in the search index; Assumed what had to be chosen.
	Checked, Assumed string
}

// narayanan is Narayanan et al. 2021 ("Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM"), §5.1: V 51,200, s
// 2048, mixed precision, A100-80GB DGX nodes, "the interleaved pipeline
// schedule with the scatter/gather optimization", activation
// recomputation (their equation 3 counts its extra forward).
func narayanan(name string, heads, hidden, layers, tp, pp, gpus, batch int, tflops float64) PublishedRun {
	r := PublishedRun{Source: "Narayanan et al. 2021, Table 1", Name: name,
		Shape: Transformer{Layers: layers, Hidden: hidden, Heads: heads, Seq: 2048, Vocab: 51200, FFN: 4 * hidden},
		GPUs:  gpus, TP: tp, PP: pp, VPP: 1, Batch: batch, MicroBatch: 1, Recompute: "full", TFLOPSPerGPU: tflops,
		Checked: "the paper's text of §5.1 and Table 1 (a markdown copy of arXiv:2104.04473 in the index; " +
			"find_string \"| 3072 | 30 | 2 | 1 | 64\" also returns three independent notes with the same ten rows)",
		Assumed: "microbatch 1; the interleaved schedule with 2 chunks per rank where the layers per stage are even, else 1F1B (the paper states neither)"}
	// The paper interleaves but does not give v; 2 is the smallest
	// interleaving, used where each stage's layers split in two and the
	// microbatches per replica are a multiple of pp (interleaving's rule).
	dp := gpus / (tp * pp)
	if pp > 1 && (layers/pp)%2 == 0 && (batch/dp)%pp == 0 {
		r.VPP = 2
	}
	return r
}

// korthikanti is Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models"), Tables 3 and 5: A100-80GB,
// s 2048, V 51,200, no data parallelism, the interleaved schedule with 3
// chunks per rank for 175B and 530B. The baseline recomputes every layer
// (tensor parallelism alone); "present work" is sequence parallelism with
// selective recomputation. MFU is given for the latter (and is the
// Megatron-LM README's table).
func korthikanti(name string, heads, hidden, layers, tp, pp, vpp, gpus, batch, micro int, full, present, mfu float64) []PublishedRun {
	shape := Transformer{Layers: layers, Hidden: hidden, Heads: heads, Seq: 2048, Vocab: 51200, FFN: 4 * hidden}
	const checked = "a reading note on arXiv:2205.05198 in the index (find_string \"20480 | 105 | 8 | 35 | 280\"), its Tables 3 and 5; " +
		"the MFU column also in the Megatron-LM README's table (find_string \"| 22B | 41.5% | 43.7% |\")"
	base := PublishedRun{Source: "Korthikanti et al. 2022, Tables 3 and 5", Shape: shape, GPUs: gpus, TP: tp, PP: pp, VPP: vpp,
		Batch: batch, MicroBatch: micro, Checked: checked}
	a, b := base, base
	a.Name, a.Recompute, a.StepSeconds = name+" full recompute", "full", full
	b.Name, b.Recompute, b.SequenceParallel, b.StepSeconds, b.MFU = name+" sp+selective", "selective", true, present, mfu
	return []PublishedRun{a, b}
}

// PublishedRuns are the runs the model is checked against, in the papers'
// row order.
func PublishedRuns() []PublishedRun {
	runs := []PublishedRun{
		narayanan("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
		narayanan("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
		narayanan("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
		narayanan("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
		narayanan("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
		narayanan("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
		narayanan("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
		narayanan("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
		narayanan("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
		narayanan("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
	}
	runs = append(runs, korthikanti("22B", 64, 6144, 48, 8, 1, 1, 8, 4, 4, 1.42, 1.10, 0.415)...)
	runs = append(runs, korthikanti("175B", 96, 12288, 96, 8, 8, 3, 64, 64, 1, 18.13, 13.75, 0.514)...)
	runs = append(runs, korthikanti("530B", 128, 20480, 105, 8, 35, 3, 280, 280, 1, 49.05, 37.83, 0.560)...)
	runs = append(runs, korthikanti("1T", 160, 25600, 128, 8, 64, 1, 512, 512, 1, 94.42, 71.49, 0.563)...)
	return runs
}

// Plan is the run's configuration as a cost.Plan (fp16 mixed precision,
// Adam, the gradient all-reduce after the backward: Megatron-LM's local
// DDP of those papers did not overlap it).
func (r PublishedRun) Plan() Plan {
	dp := r.GPUs / (r.TP * r.PP)
	p := Plan{TP: r.TP, PP: r.PP, DP: dp, VPP: r.VPP, MicroBatch: r.MicroBatch,
		Microbatches: r.Batch / (dp * r.MicroBatch), SequenceParallel: r.SequenceParallel,
		Recompute: r.Recompute, Precision: "fp16", Optimizer: "adamw", SerialReductions: true}
	if r.PP > 1 {
		p.Schedule = "1f1b"
		if r.VPP > 1 {
			p.Schedule = "interleaved"
		}
	}
	return p
}

// PaperFLOPs is one step's work as Narayanan et al. count it (their
// equation 3: the GEMMs of forward, backward and a recomputed forward,
// 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))), the numerator of the published
// TFLOP/s per GPU whatever the run recomputes.
func (r PublishedRun) PaperFLOPs() float64 {
	B, s, l, h, V := float64(r.Batch), float64(r.Shape.Seq), float64(r.Shape.Layers), float64(r.Shape.Hidden), float64(r.Shape.Vocab)
	return 96 * B * s * l * h * h * (1 + s/(6*h) + V/(16*l*h))
}

// PublishedStep is the measured iteration time: given, or derived from
// the published throughput and PaperFLOPs.
func (r PublishedRun) PublishedStep() float64 {
	if r.StepSeconds > 0 {
		return r.StepSeconds
	}
	return r.PaperFLOPs() / (float64(r.GPUs) * r.TFLOPSPerGPU * 1e12)
}
