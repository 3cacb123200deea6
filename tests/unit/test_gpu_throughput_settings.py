"""bench.gpu.throughput's phase settings: what reaches (a), vLLM's defaults, and what reaches regen's phases."""

from bench.gpu.throughput import phase_settings


def test_a_candidate_reaches_regens_phases_and_never_a():
    extra, settings, bare = phase_settings(["max_num_seqs=64"], ["watermark=0.03"], on_cpu=False)
    assert extra["watermark"] == settings["watermark"] == 0.03  # over regen's own 0.01
    assert "watermark" not in bare  # (a) is vLLM's default, 0, so the ratio prices the candidate
    assert extra["max_num_seqs"] == settings["max_num_seqs"] == bare["max_num_seqs"] == 64  # --engine-arg: every engine
    assert bare["load_format"] == settings["load_format"] == "dummy"


def test_without_a_candidate_regens_phases_get_regens_defaults():
    extra, settings, bare = phase_settings([], [], on_cpu=False)
    assert "watermark" not in extra and settings["watermark"] == 0.01  # the worker adds its own default
    assert "watermark" not in bare
    # What the user sets for every engine, (a) keeps even where it is one of regen's own choices.
    _, settings, bare = phase_settings(["watermark=0.05"], [], on_cpu=False)
    assert settings["watermark"] == bare["watermark"] == 0.05


def test_the_gpu_sampler_reports_the_memory_peak_beside_the_busy_share():
    from bench.gpu.smi import GpuSampler

    gpu = GpuSampler()
    for line in ("0, 90, 120000, 143771", "0, 100, 136512, 143771", "0, 40, 131000, 143771", "0, [N/A], 1, 2"):
        gpu.record(line)
    summary = gpu.summary()
    assert "mean 77% busy, 2/3 samples at 50% or more" in summary  # the [N/A] line counted nowhere
    assert "peak 136,512 of 143,771 MiB in use (95.0%; 7.1 GiB free at the sampled peak)" in summary
    # An nvidia-smi that gives no memory columns still gives the busy share, and no memory claim.
    old = GpuSampler()
    old.record("1, 55")
    assert old.summary() == "GPU 1: mean 55% busy, 1/1 samples at 50% or more"


def test_the_estimate_phase_passes_the_workers_engine_args_and_the_probe_results_file(tmp_path):
    from argparse import Namespace

    from bench.gpu.throughput import estimate_options

    extra, _, _ = phase_settings(["max_num_seqs=64"], ["watermark=0.03"], on_cpu=False)
    kept = tmp_path / "probe-32b.json"
    options = estimate_options(Namespace(estimate=256, probe_results=str(kept), probe_settled=0.5), extra)
    assert options.sample_size == 256 and options.engines == 1
    assert options.probe_results == str(kept)  # written by a first call, reused by a later one
    assert options.settled_share == 0.5  # --probe-settled: the probe that fits one lent machine
    assert "watermark=0.03" in options.engine_args and "max_num_seqs=64" in options.engine_args
    default = estimate_options(Namespace(estimate=256, probe_results=None, probe_settled=None), extra)
    assert default.probe_results is None and default.settled_share is None


def test_the_probes_phases_line_sets_the_first_half_rate_beside_the_whole():
    from bench.gpu.throughput import probe_phases

    line = probe_phases({"load_s": 80.0, "samples_phase_s": 277.0, "settled_phase_s": 277.5, "settled_share": 1.0,
                         "drain_s": 125.0, "drain_unstarted_aborted": 1250, "drain_loss_s": 60.2,
                         "tokens_per_s": 8313.0, "settled_first_half_tokens_per_s": 8230.0})
    assert "samples 277.0 s, settled 277.5 s (share 1.0), drain 125.0 s (1250 unstarted dropped; 60.2 s lost)" in line
    assert line.endswith("rate 8,313 tok/s over the settled phase, 8,230 over its first half (0.990 of it)")
    # An older probe (no half, no phases) still prints, with dashes.
    assert "samples -, settled -" in probe_phases({"tokens_per_s": 100.0})
