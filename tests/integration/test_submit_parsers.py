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


#: Published templates (tests/data/templates) a plain submit must accept: (reasoning, tool, chosen_by, thinking).
PUBLISHED = {"kimi_k2_instruct.jinja": ("none", "kimi_k2", "template: kimi", "off"),
             "kimi_k2_thinking.jinja": ("kimi_k2", "kimi_k2", "template: kimi", "on"),
             "mistral_small31.jinja": ("none", "mistral", "template: mistral", "off")}


@pytest.mark.parametrize("template", sorted(PUBLISHED))
def test_a_plain_submit_on_kimis_and_mistrals_published_templates_records_their_parsers(
        template, settings, s3_env, s3_bucket, sessions, tmp_path):
    from pathlib import Path

    from tests.support.model_folder import write_model_folder

    source = Path(__file__).resolve().parents[1] / "data" / "templates" / template
    # A folder as submit checks it (config, tokenizer, template: producer/submit_checks.py), no weights.
    model = write_model_folder(tmp_path / "model", chat_template=source.read_text())
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"id": "u1", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    env = cli_env(settings, s3_env)
    run = f"pub-{template.split('.')[0]}"
    base = ["submit", str(data), "--model", str(model), "--output", f"{s3_bucket}/{run}", "--queue", "nobody"]
    out = run_cli([*base, "--run", run], env)
    reasoning, tool, chosen_by, thinking = PUBLISHED[template]
    assert f"parsers: reasoning {reasoning}, tool {tool} ({chosen_by})" in out.stdout
    with sessions() as s:
        row = s.execute(text("SELECT sampling FROM runs WHERE name = :n"), {"n": run}).one()
    assert (row.sampling["reasoning_parser"], row.sampling["tool_parser"], row.sampling["thinking"]) == (
        reasoning, tool, thinking)
    # The mode the template cannot render is refused at submit, with the reason, and leaves no run.
    other = "off" if thinking == "on" else "on"
    refused = run_cli([*base, "--run", f"{run}-x", "--thinking", other], env, check=False)
    assert refused.returncode == 2 and f"--thinking {other} cannot be rendered" in refused.stderr
