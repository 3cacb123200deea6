"""``regen submit`` chooses each target's own vLLM parsers without flags, says so, and records them."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from tests.support.helpers import cli_env, run_cli

EXPECTED = {"qwen3": ("qwen3", "hermes", "template: qwen3"),
            "llama3": ("none", "llama3_json", "template: llama3"),
            "deepseek_r1": ("deepseek_r1", "deepseek_v3", "template: deepseek"),
            "glm45": ("glm45", "glm45", "template: glm45")}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    from worker.tiny.family_model import build_tiny_model

    root = tmp_path_factory.mktemp("family-models")
    return {name: build_tiny_model(root / name, variant="random", family=name) for name in EXPECTED}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_submit_reads_the_parsers_off_the_template_and_records_them(family, family_models, settings, s3_env,
                                                                    s3_bucket, sessions, tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"id": "u1", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    out = run_cli(["submit", str(data), "--run", f"p-{family}", "--model", str(family_models[family]),
                   "--output", f"{s3_bucket}/p", "--queue", "nobody"], cli_env(settings, s3_env))
    reasoning, tool, chosen_by = EXPECTED[family]
    assert f"parsers: reasoning {reasoning}, tool {tool} ({chosen_by})" in out.stdout
    with sessions() as s:
        run = s.execute(text("SELECT sampling, provenance FROM runs WHERE name = :n"), {"n": f"p-{family}"}).one()
    assert (run.sampling["reasoning_parser"], run.sampling["tool_parser"]) == (reasoning, tool)
    assert run.provenance["parsers"] == {"reasoning_parser": reasoning, "tool_parser": tool, "chosen_by": chosen_by}


def test_named_parsers_override_the_template_and_a_typo_is_refused(family_models, settings, s3_env, s3_bucket,
                                                                  sessions, tmp_path):
    env = cli_env(settings, s3_env)
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"id": "u1", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    base = ["submit", str(data), "--model", str(family_models["qwen3"]), "--output", f"{s3_bucket}/n",
            "--queue", "nobody"]
    out = run_cli([*base, "--run", "named", "--reasoning-parser", "none", "--tool-parser", "qwen3_xml"], env)
    assert "parsers: reasoning none, tool qwen3_xml (named)" in out.stdout
    refused = run_cli([*base, "--run", "typo", "--tool-parser", "hermez"], env, check=False)
    assert refused.returncode == 2
    assert "--tool-parser 'hermez' is not a parser vLLM knows" in refused.stderr and "hermes" in refused.stderr
    # Another parser under an existing run name is another config: refused like a changed temperature.
    again = run_cli([*base, "--run", "named", "--tool-parser", "hermes"], env, check=False)
    assert again.returncode == 2 and "tool_parser 'qwen3_xml' != 'hermes'" in again.stderr
