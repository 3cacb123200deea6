"""regen's memory model of a hybrid (worker/engine/cache_plan.py) gives what vLLM's own planner gives.

On the published Qwen3.6-27B config (tests/data/models, its sources in SOURCE.md), for an H200 and an
H100 at vLLM's default share of the card: the attention block vLLM pads to (its
``Platform._align_hybrid_block_size``, run here with Hopper's 16-token kernel block), the groups it
makes of the layers (``get_kv_cache_groups``), the blocks it makes of the card's memory
(``get_kv_cache_config_from_groups``) and the sequences and tokens it then says it holds
(``get_kv_cache_capacity``). vLLM's functions are driven on the same numbers, without an engine; the
installed vLLM is the CPU build (0.32), whose rules for this model are 0.26's (the GPUs'): the same
alignment and grouping, checked in both sources (docs/performance.md, "The hybrid's memory").
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.model import VLLM_HINT
from tests.support.helpers import require
from worker.engine.cache_plan import (
    CARD_BYTES,
    CachePlan,
    CacheShape,
    card_kv_bytes,
    engine_capacity,
    engine_plan,
    model_params,
    plan_on_card,
)

CONFIG = json.loads((Path(__file__).resolve().parents[1] / "data" / "models" / "qwen36_27b_config.json").read_text())


def test_the_27b_keeps_147_mib_of_state_a_sequence_and_64_kib_of_kv_a_token():
    shape = CacheShape.from_config(CONFIG)
    assert (shape.attention_layers, shape.state_layers) == (16, 48)
    assert shape.kv_bytes_per_token == 16 * 2 * 4 * 256 * 2 == 64 * 1024
    # conv: (2 x 16 x 128 + 48 x 128) channels x 3 columns in bf16; SSM: 48 x 128 x 128 in float32
    assert shape.conv_state_bytes == 10240 * 3 * 2
    assert shape.ssm_state_bytes == 48 * 128 * 128 * 4
    assert round(shape.state_bytes_per_sequence / 2**20, 1) == 146.8
    plan = CachePlan.of(shape)
    assert plan.block_size == 784 and plan.page_bytes == 784 * 4096  # 49 x 16 tokens: a page holds a state
    assert (plan.group_size, plan.attention_groups, plan.state_groups, plan.state_blocks) == (16, 1, 3, 1)


def test_a_dense_model_keeps_its_plan_of_kv_only():
    dense = {"num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 64, "num_key_value_heads": 8,
             "head_dim": 128}
    plan = CachePlan.of(CacheShape.from_config(dense))
    assert not plan.shape.hybrid and plan.state_tokens() == 0
    assert plan.token_slots(1000) == 16000  # every block is KV: no state takes any
    assert plan.sequences(1000, 1600) == 10  # 100 blocks of 16 a sequence


def test_the_27b_weighs_what_its_safetensors_do():
    # The published shards hold 55.56 GB with the vision tower (~0.46 B parameters) and the MTP layer.
    text = model_params(CONFIG)
    assert 26.8e9 < text < 27.0e9
    assert 0.4e9 < model_params(CONFIG, mtp=True) - text < 0.45e9


def test_a_built_engine_is_read_back_with_its_aligned_block():
    cfg = SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(**CONFIG["text_config"])),
        cache_config=SimpleNamespace(block_size=784, mamba_cache_mode="align", cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1), speculative_config=None)
    plan = engine_plan(cfg)
    assert plan is not None and plan.block_size == 784 and plan.state_blocks == 2
    assert engine_plan(SimpleNamespace()) is None  # what it cannot read, it does not guess


# --- against vLLM's own planner ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_planner():
    """vLLM's planning functions, and a stand-in for the two things they need of a built engine: the
    attention backend (Hopper's 16-token kernel block) and the model class (vLLM's own GDN state shapes)."""
    require("vllm", VLLM_HINT)
    import torch
    from vllm.config import CacheConfig, VllmConfig
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    text = SimpleNamespace(**CONFIG["text_config"])

    class HopperAttention:  # FlashAttention's and FlashInfer's smallest kernel block on an H100/H200
        @classmethod
        def get_supported_kernel_block_sizes(cls, *_):
            return [MultipleOf(16)]

        @classmethod
        def customize_spec(cls, spec):
            return spec

    class Gpu(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, _):
            return [HopperAttention]

    def state_shape(k: int):
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            1, text.linear_num_key_heads, text.linear_num_value_heads, text.linear_key_head_dim,
            text.linear_value_head_dim, text.linear_conv_kernel_dim, k)

    state_dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto", text.mamba_ssm_dtype)

    def plan(*, available: int, max_model_len: int, prefix_caching: bool, k: int = 0):
        cache = CacheConfig(block_size=16, mamba_cache_mode="align" if prefix_caching else "none",
                            mamba_ssm_cache_dtype=text.mamba_ssm_dtype)
        cache.kv_cache_layout = "LBHNC"  # 0.26's one layout (no block-outermost packing)
        config = VllmConfig(cache_config=cache)
        model = SimpleNamespace(dtype=torch.bfloat16, use_mla=False, architecture="Qwen3_5ForCausalLM",
                                get_num_kv_heads=lambda _: text.num_key_value_heads, get_head_size=lambda: text.head_dim,
                                max_model_len=max_model_len, is_hybrid=True)
        object.__setattr__(config, "model_config", model)
        model_cls = SimpleNamespace(get_mamba_state_shape_from_config=lambda _: state_shape(k),
                                    get_mamba_state_dtype_from_config=lambda _: state_dtypes)
        import vllm.model_executor.models as models

        resolve = models.ModelRegistry.resolve_model_cls
        models.ModelRegistry.resolve_model_cls = lambda *a, **kw: (model_cls, "Qwen3_5ForCausalLM")
        try:
            Gpu._align_hybrid_block_size(config, HopperAttention)
        finally:
            models.ModelRegistry.resolve_model_cls = resolve
        block = cache.block_size
        specs = {}
        for i, kind in enumerate(text.layer_types):
            if kind == "full_attention":
                specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                    block_size=block, num_kv_heads=text.num_key_value_heads, head_size=text.head_dim,
                    dtype=torch.bfloat16)
            else:
                specs[f"model.layers.{i}.linear_attn"] = MambaSpec(
                    shapes=state_shape(k), dtypes=state_dtypes, block_size=block,
                    page_size_padded=cache.mamba_page_size_padded, mamba_cache_mode=cache.mamba_cache_mode,
                    num_speculative_blocks=k)
        for i in range(text.mtp_num_hidden_layers if k else 0):  # the drafter's layers are full attention
            specs[f"mtp.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=block, num_kv_heads=text.num_key_value_heads, head_size=text.head_dim, dtype=torch.bfloat16)
        groups = kv_cache_utils.get_kv_cache_groups(config, specs)
        kv = kv_cache_utils.get_kv_cache_config_from_groups(config, groups, available)
        tokens, sequences = kv_cache_utils.get_kv_cache_capacity(config, kv)
        return block, kv.num_blocks, tokens, sequences

    return plan


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("max_model_len", [262144, 40960])
def test_on_an_h200_the_27b_holds_what_vllm_plans(vllm_planner, prefix_caching, max_model_len):
    _holds_what_vllm_plans(vllm_planner, "H200", prefix_caching, max_model_len)


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("max_model_len", [262144, 40960])
def test_on_an_h100_the_27b_holds_what_vllm_plans(vllm_planner, prefix_caching, max_model_len):
    _holds_what_vllm_plans(vllm_planner, "H100", prefix_caching, max_model_len)


def _holds_what_vllm_plans(vllm_planner, card: str, prefix_caching: bool, max_model_len: int) -> None:
    plan, blocks = plan_on_card(CONFIG, card, prefix_caching=prefix_caching)
    available = card_kv_bytes(CARD_BYTES[card], 2 * model_params(CONFIG))
    vllm_block, vllm_blocks, vllm_tokens, vllm_sequences = vllm_planner(
        available=available, max_model_len=max_model_len, prefix_caching=prefix_caching)
    assert plan.block_size == vllm_block
    assert blocks == vllm_blocks
    assert plan.sequences(blocks, max_model_len) == pytest.approx(vllm_sequences, rel=1e-12)
    assert plan.tokens(blocks, max_model_len) == vllm_tokens


def test_with_mtp_the_draft_layer_and_its_states_are_planned_as_vllm_plans(vllm_planner):
    # One speculative token: the MTP layer's attention joins the pool (17 attention layers, so groups of 17),
    # each GDN layer's conv state grows a column, and each state group keeps one block more for the draft.
    plan, blocks = plan_on_card(CONFIG, "H200", speculative_tokens=1)
    assert (plan.shape.attention_layers, plan.group_size, plan.state_groups, plan.state_blocks) == (17, 17, 3, 3)
    available = card_kv_bytes(CARD_BYTES["H200"], 2 * model_params(CONFIG, mtp=True))
    block, vllm_blocks, tokens, _ = vllm_planner(available=available, max_model_len=262144, prefix_caching=True, k=1)
    assert (plan.block_size, blocks, plan.tokens(blocks, 262144)) == (block, vllm_blocks, tokens)


def _engine_config(**cache):
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(**CONFIG["text_config"])),
        cache_config=SimpleNamespace(**{"block_size": 784, "mamba_cache_mode": "align", "cache_dtype": "auto",
                                        "num_gpu_blocks": 1573, **cache}),
        parallel_config=SimpleNamespace(tensor_parallel_size=1), speculative_config=None)


def test_the_engine_capacity_is_the_sequences_vllm_holds_not_its_blocks_slots():
    # Where the engine does not report its own figure, the plan's is vLLM's (1,209,244 tokens for the 1,573
    # blocks of an H200, as test_on_an_h200... checks); blocks x block_size (1,233,232) counted the states'
    # blocks as tokens.
    capacity = engine_capacity(_engine_config(), 262144)
    assert capacity.tokens == 1_209_244 != 1573 * 784
    assert capacity.sequences == pytest.approx(1573 / (335 + 6))
    assert "4.61 sequences of 262,144" in capacity.note() and "MiB of state a sequence" in capacity.note()
    assert capacity.record()["state_blocks_per_sequence"] == 6
    # vLLM's own figure, where the engine reports it to its client, is what is printed and recorded.
    assert engine_capacity(_engine_config(kv_cache_size_tokens=1_208_000), 262144).tokens == 1_208_000


def test_the_estimate_says_what_each_card_holds_of_the_samples_mean_sequence(tmp_path):
    from producer.estimate.estimator import EstimateOptions, build_estimate
    from producer.estimate.render import render_estimate
    from producer.estimate.sample import draw_sample
    from producer.run_config import RunConfig
    from tests.unit.test_estimate_math import _chat, _probe_for, _write_dataset

    model = tmp_path / "qwen36"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    _write_dataset(tmp_path / "a.jsonl", [_chat(i, 1, 5) for i in range(100)])
    drawn = draw_sample([str(tmp_path / "a.jsonl")], 20, seed=1)
    probe = _probe_for(drawn, lambda c: 100)  # 100 output and 300 prompt tokens a row: sequences of 400
    doc = build_estimate(drawn, probe, RunConfig(model=str(model), max_tokens=512, sampling={}),
                         EstimateOptions(sample_size=20, mtp=0), inputs=["a"])
    h200 = doc["memory"]["H200"]
    plan, blocks = plan_on_card(CONFIG, "H200")
    assert h200["sequences"] == round(blocks / (1 + 6), 1) == round(plan.sequences(blocks, 400), 1)
    assert "an H100 alone holds" in render_estimate(doc) and "146.8 MiB of state + 64.0 KiB a token" in render_estimate(doc)


def test_an_engine_running_in_float32_is_read_in_its_own_dtype():
    # vLLM's CPU build may run a bf16 checkpoint in float32: its KV and conv state are then twice the config's.
    cfg = _engine_config()
    cfg.model_config.dtype = "torch.float32"
    cfg.cache_config.mamba_ssm_cache_dtype = "float32"
    shape = engine_plan(cfg).shape
    assert shape.kv_bytes_per_token == 2 * 64 * 1024 and shape.conv_state_bytes == 10240 * 3 * 4
