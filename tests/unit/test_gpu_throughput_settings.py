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
