"""bench/gpu/prebuild_tiny.py builds every tiny model the fidelity suites ask for, so a GPU run finds them all built."""

from __future__ import annotations


def test_the_prebuild_list_covers_every_family_the_fidelity_suites_build():
    from bench.gpu.prebuild_tiny import LEAD, fidelity_families
    from tests.integration.test_family_fidelity import CASES

    built = fidelity_families()
    asked = {case.family for case in CASES} | {"qwen3", "gpt_oss"}
    assert asked <= set(built), sorted(asked - set(built))
    assert built[0] == LEAD and len(built) == len(set(built))


def test_regens_own_model_the_longest_build_gets_half_the_cores_and_the_families_their_share():
    from bench.gpu.prebuild_tiny import LEAD, threads_for

    assert threads_for(LEAD, 8, 1) == 4 and threads_for("llama3", 8, 1) == 1
    assert threads_for(LEAD, 2, 1) == 1  # never below what a family gets


def test_an_unknown_family_is_refused_by_name_before_anything_builds(capsys):
    import pytest

    from bench.gpu.prebuild_tiny import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--families", "llama3,nonesuch"])
    assert exit_info.value.code == 2
    assert "nonesuch not in worker/tiny/families.py" in capsys.readouterr().err
