"""How vLLM lays out a model's cache, dense or hybrid, and what that holds: sequences and tokens.

Issue 56: Qwen3.6-27B is a hybrid. 48 of its 64 layers are Gated DeltaNet (linear attention): each
keeps, per sequence, a fixed recurrent state (a conv state and an SSM state of 48 value heads of
128 x 128, in ``mamba_ssm_dtype``: float32) whatever the sequence's length. Only its 16 full-attention
layers keep KV per token. vLLM (0.26 on the GPUs, 0.32 on the CPU: the same rules, checked in both
sources) puts both in one pool of blocks:

- a block is one *page* per layer of a group, and every page has one size: the attention block is
  enlarged until an attention page (``block_size x`` KV per token per layer) holds a state page, in
  steps of the attention kernel's block (16 tokens on Hopper's FlashAttention/FlashInfer, 128 on the
  CPU build); the state page is then padded up to the attention page
  (``Platform._align_hybrid_block_size``). For the 27B: 784-token blocks, 3,211,264-byte pages.
- layers are grouped by kind, ``group_size`` layers a group (the fewest of one kind, unless the most
  are under 1.5 times that: ``_get_kv_cache_groups_uniform_page_size``): the 27B has one group of 16
  attention layers and three of 16 state layers; the pool's blocks are ``group_size`` pages each.
- a sequence takes ``cdiv(tokens, block_size)`` blocks in each attention group and, in each state
  group, one block (``mamba_cache_mode`` "none": prefix caching off), two ("align": prefix caching
  on, the state at the last block boundary kept beside the running one), plus one per speculative
  token (``MambaSpec.max_memory_usage_bytes``).

vLLM's own "KV cache size: N tokens" is ``num_blocks / blocks_per_sequence(max_model_len) x
max_model_len`` (``get_kv_cache_capacity``): what the pool holds at max_model_len. regen printed
``num_blocks x block_size`` (8,388,480 for a tiny hybrid where vLLM said 5,368,627): a count of
attention slots as if no block went to states. Pure arithmetic (no vLLM or torch import), so the
estimate and the benchmarks' bound use it too; tests/unit/test_cache_plan.py holds it to vLLM's own
planner functions on the published 27B config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Bytes of the dtypes configs name.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}
#: vLLM's block of tokens before any hybrid alignment (CacheConfig.DEFAULT_BLOCK_SIZE on GPUs).
DEFAULT_BLOCK_SIZE = 16
#: The smallest block Hopper's attention kernels take (FlashAttention and FlashInfer: multiples of 16).
GPU_KERNEL_BLOCK = 16
#: Above this ratio of the larger kind's layers to the smaller's, vLLM groups by the smaller count.
_GROUP_RATIO = 1.5


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: ``text_config`` of a multimodal checkpoint, else the config itself."""
    return config.get("text_config") or config


@dataclass(frozen=True)
class CacheShape:
    """What a model keeps per sequence, per layer, as its config.json says (for one tensor-parallel rank).

    ``state_*`` are zero for a dense model. Speculative tokens widen the conv state (vLLM keeps
    ``kernel - 1 + k`` columns) and each MTP layer adds an attention layer with its own KV.
    """

    attention_layers: int
    kv_bytes_per_token_layer: int
    state_layers: int = 0
    conv_state_bytes: int = 0
    ssm_state_bytes: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any], *, tp: int = 1, speculative_tokens: int = 0,
                    kv_dtype_bytes: int | None = None, dtype_bytes: int | None = None,
                    ssm_dtype_bytes: int | None = None) -> CacheShape:
        """From a config.json's dict (a multimodal checkpoint's ``text_config`` is used). ``dtype_bytes`` and
        ``ssm_dtype_bytes``: what a built engine runs in, where it differs from the config (the CPU build).

        Raises:
            ValueError: a layer kind this model does not know, or a config without the sizes it needs.
        """
        c = text_config(config)
        model_bytes = dtype_bytes or DTYPE_BYTES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), 2)
        layers = int(c["num_hidden_layers"])
        kinds = c.get("layer_types") or []
        if not kinds and c.get("full_attention_interval"):
            every = int(c["full_attention_interval"])
            kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
        if not kinds:
            kinds = ["full_attention"] * layers
        unknown = sorted(set(kinds) - {"full_attention", "linear_attention"})
        if unknown:
            raise ValueError(f"layer_types {unknown}: only full_attention and linear_attention are modelled")
        heads = int(c.get("num_attention_heads") or 1)
        head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
        kv_heads = max(1, int(c.get("num_key_value_heads") or heads) // tp)
        kv_token = 2 * kv_heads * head_dim * (kv_dtype_bytes or model_bytes)  # K and V
        mtp_layers = int(c.get("mtp_num_hidden_layers") or 0) if speculative_tokens else 0
        attention = kinds.count("full_attention") + mtp_layers
        states = kinds.count("linear_attention")
        if not states:
            return cls(attention, kv_token)
        nk, nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
        dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        conv_dim = (2 * nk * dk + nv * dv) // tp
        conv = conv_dim * (int(c["linear_conv_kernel_dim"]) - 1 + speculative_tokens) * model_bytes
        ssm_bytes = ssm_dtype_bytes or DTYPE_BYTES.get(str(c.get("mamba_ssm_dtype") or ""), model_bytes)
        ssm = (nv // tp) * dv * dk * ssm_bytes
        return cls(attention, kv_token, states, conv, ssm)

    @property
    def hybrid(self) -> bool:
        return self.state_layers > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV of one token over every attention layer (unpadded)."""
        return self.attention_layers * self.kv_bytes_per_token_layer

    @property
    def state_bytes_per_layer(self) -> int:
        return self.conv_state_bytes + self.ssm_state_bytes

    @property
    def state_bytes_per_sequence(self) -> int:
        """One sequence's recurrent state over every linear-attention layer (unpadded)."""
        return self.state_layers * self.state_bytes_per_layer


@dataclass(frozen=True)
class CachePlan:
    """vLLM's pool for a :class:`CacheShape`: its block, page and groups, and what a sequence takes of it."""

    shape: CacheShape
    block_size: int
    page_bytes: int
    group_size: int
    attention_groups: int
    state_groups: int
    #: Blocks each state group holds per sequence: 1, 2 with prefix caching ("align"), + speculative tokens.
    state_blocks: int

    @classmethod
    def of(cls, shape: CacheShape, *, block_size: int = DEFAULT_BLOCK_SIZE, kernel_block: int = GPU_KERNEL_BLOCK,
           prefix_caching: bool = False, speculative_tokens: int = 0, aligned: bool = False) -> CachePlan:
        """The plan vLLM makes. ``block_size``: the block before hybrid alignment; ``aligned``: it is the
        engine's block after alignment already (read from a built engine), so it is kept as it is."""
        if not shape.hybrid:
            page = block_size * shape.kv_bytes_per_token_layer
            return cls(shape, block_size, page, shape.attention_layers, 1, 0, 0)
        per_token = shape.kv_bytes_per_token_layer
        if not aligned:
            step = max(kernel_block, block_size)
            block_size = max(block_size, step * _cdiv(shape.state_bytes_per_layer, step * per_token))
        page = block_size * per_token
        if page < shape.state_bytes_per_layer:
            raise ValueError(f"block of {block_size} tokens: its page ({page:,} B) is smaller than a state "
                             f"({shape.state_bytes_per_layer:,} B); vLLM never builds that")
        few, many = sorted((shape.attention_layers, shape.state_layers))
        group_size = many if many < few * _GROUP_RATIO else few
        return cls(shape, block_size, page, group_size, _cdiv(shape.attention_layers, group_size),
                   _cdiv(shape.state_layers, group_size), (2 if prefix_caching else 1) + speculative_tokens)

    @property
    def bytes_per_block(self) -> int:
        """One block of the pool: a page for each of a group's layers."""
        return self.group_size * self.page_bytes

    def num_blocks(self, available_bytes: int) -> int:
        """Blocks vLLM makes of ``available_bytes`` of KV-cache memory."""
        return max(0, int(available_bytes) // self.bytes_per_block)

    def blocks_per_sequence(self, tokens: int) -> int:
        """Blocks one sequence of ``tokens`` holds: its KV's blocks in each attention group, its states'."""
        return self.attention_groups * _cdiv(max(1, int(tokens)), self.block_size) + self.state_groups * self.state_blocks

    def sequences(self, num_blocks: int, tokens: int) -> float:
        """Sequences of ``tokens`` each that ``num_blocks`` hold (vLLM's "maximum concurrency" at that length)."""
        return num_blocks / self.blocks_per_sequence(tokens)

    def tokens(self, num_blocks: int, max_model_len: int) -> int:
        """vLLM's "KV cache size" in tokens: the sequences of max_model_len the pool holds, times that length."""
        return int(self.sequences(num_blocks, max_model_len) * max_model_len)

    def token_slots(self, num_blocks: int) -> int:
        """Tokens of KV the pool holds when no block goes to states: the scale sizing divides by footprints."""
        return num_blocks * self.block_size // self.attention_groups

    def state_tokens(self) -> float:
        """A sequence's states, in tokens of :meth:`token_slots`, plus half a block the last KV block wastes on
        average: what a sequence costs beyond its tokens (worker/engine/sizing.py adds it to each footprint)."""
        if not self.shape.hybrid:
            return 0.0
        states = self.state_groups * self.state_blocks * self.block_size / self.attention_groups
        return states + self.block_size / 2

    def describe(self) -> str:
        """One line: what a sequence costs, for logs and the estimate."""
        per_token = self.shape.kv_bytes_per_token
        kv = f"{per_token / 1024:,.0f} KiB of KV a token" if per_token >= 1024 else f"{per_token} B of KV a token"
        if not self.shape.hybrid:
            return f"{kv} ({self.shape.attention_layers} attention layers), {self.block_size}-token blocks"
        return (f"{self.shape.state_bytes_per_sequence / 2**20:,.1f} MiB of state a sequence "
                f"({self.shape.state_layers} linear-attention layers) + {kv} ({self.shape.attention_layers} attention "
                f"layers); {self.block_size}-token blocks, a sequence's state taking "
                f"{self.state_groups * self.state_blocks} of them")


def engine_plan(vllm_config: Any) -> CachePlan | None:
    """The plan of a built engine, from its config (read by duck typing: no vLLM import); None if it can't say."""
    try:
        hf = vllm_config.model_config.hf_text_config
        config = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
        cache = vllm_config.cache_config
        spec = getattr(vllm_config, "speculative_config", None)
        k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
        tp = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
        kv_dtype = str(getattr(cache, "cache_dtype", "auto"))
        dtype = str(getattr(vllm_config.model_config, "dtype", "")).removeprefix("torch.")
        ssm = str(getattr(cache, "mamba_ssm_cache_dtype", "auto"))
        shape = CacheShape.from_config(config, tp=tp, speculative_tokens=k,
                                       kv_dtype_bytes=None if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1),
                                       dtype_bytes=DTYPE_BYTES.get(dtype), ssm_dtype_bytes=DTYPE_BYTES.get(ssm))
        prefix = str(getattr(cache, "mamba_cache_mode", "none")) != "none"
        return CachePlan.of(shape, block_size=int(cache.block_size), prefix_caching=prefix,
                            speculative_tokens=k, aligned=True)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


#: vLLM's default share of a card (``gpu_memory_utilization``: 0.92 in 0.26 and 0.32).
VLLM_GPU_SHARE = 0.92
#: A card's memory as vLLM sees it (torch's total, below nvidia-smi's 143,771 and 81,559 MiB), and what its
#: share spends beyond weights and cache (activations at the profiling batch, CUDA graphs, non-torch memory).
#: Both from caches measured at two shares of one card: the 32B shape on an H200, 275,264 tokens at 0.92 and
#: 292,432 at 0.95 (worker/engine/gpu_memory.py), make 0.03 of the card 4.50 GB (a card of 150.02 GB) and
#: leave 3.39 GB beside 62.47 GB of weights; the 8B shape on an H100, 422,656 and 439,952 tokens
#: (docs/results/h100-gpu-block-size-8b-2026-12-06.txt), a card of 85.01 GB and 1.95 GB beside 13.9 GB.
#: The 32B's reserve (hidden 5,120, as the 27B's) stands for the 27B hybrid on both cards: an assumption
#: until an engine's log on a GPU measures it (docs/performance.md, "The hybrid's memory").
ENGINE_RESERVE_BYTES = 3_390_000_000
CARD_BYTES = {"H200": 150_016_000_000, "H100": 85_013_000_000}


def model_params(config: dict[str, Any], *, mtp: bool = False) -> int:
    """Parameters of the language model (no vision tower), as vLLM loads it: with its MTP layers if ``mtp``."""
    c = text_config(config)
    hidden, inter = int(c["hidden_size"]), int(c["intermediate_size"])
    heads = int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    gate = 2 if c.get("attn_output_gate") else 1  # Qwen3.5's gated attention: q_proj yields queries and gates
    attention = hidden * head_dim * (heads * gate + 2 * kv_heads) + heads * head_dim * hidden + 2 * head_dim
    mlp = 3 * hidden * inter + 2 * hidden  # gate, up, down; the layer's two norms
    shape = CacheShape.from_config(c)
    layers = shape.attention_layers * (attention + mlp)
    if shape.hybrid:
        nk, nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
        dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        conv_dim = 2 * nk * dk + nv * dv
        linear = (hidden * (conv_dim + nv * dv)      # in_proj_qkv and in_proj_z
                  + hidden * 2 * nv                  # in_proj_b and in_proj_a
                  + conv_dim * int(c["linear_conv_kernel_dim"]) + 2 * nv + dv  # conv1d, A_log, dt_bias, norm
                  + nv * dv * hidden)                # out_proj
        layers += shape.state_layers * (linear + mlp)
    vocab = int(c["vocab_size"])
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2) + hidden
    extra = 0
    if mtp:  # each MTP layer: fc over [embedding; hidden], two norms before it, a full-attention layer, a norm
        extra = int(c.get("mtp_num_hidden_layers") or 0) * (2 * hidden * hidden + 3 * hidden + attention + mlp)
    return layers + embed + extra


def card_kv_bytes(card_bytes: float, weight_bytes: int, *, share: float = VLLM_GPU_SHARE,
                  reserve_bytes: int = ENGINE_RESERVE_BYTES) -> int:
    """Bytes vLLM gives its cache on a card: its share of the card less weights and the engine's reserve."""
    return max(0, int(card_bytes * share) - int(weight_bytes) - int(reserve_bytes))


def plan_on_card(config: dict[str, Any], card: str, *, share: float = VLLM_GPU_SHARE, prefix_caching: bool = True,
                 speculative_tokens: int = 0) -> tuple[CachePlan, int]:
    """The plan and its blocks for ``config`` alone on one ``card`` (a :data:`CARD_BYTES` key), bf16 weights."""
    shape = CacheShape.from_config(config, speculative_tokens=speculative_tokens)
    plan = CachePlan.of(shape, prefix_caching=prefix_caching, speculative_tokens=speculative_tokens)
    weights = 2 * model_params(config, mtp=speculative_tokens > 0)
    return plan, plan.num_blocks(card_kv_bytes(CARD_BYTES[card], weights, share=share))


@dataclass(frozen=True)
class EngineCapacity:
    """What a built engine's cache holds, as vLLM's own log says it, and the pool behind it."""

    tokens: int = 0
    blocks: int = 0
    max_model_len: int = 0
    plan: CachePlan | None = None

    @property
    def sequences(self) -> float:
        """Sequences of max_model_len the blocks hold (vLLM's "maximum concurrency")."""
        if self.plan is None or not self.blocks or not self.max_model_len:
            return 0.0
        return self.plan.sequences(self.blocks, self.max_model_len)

    def note(self) -> str:
        """What the tokens rest on, for the worker's start line: a hybrid's tokens are not its blocks' slots."""
        if self.plan is None or not self.blocks:
            return ""
        note = f" = {self.sequences:,.2f} sequences of {self.max_model_len:,}; {self.blocks:,} blocks"
        return note + (f", {self.plan.describe()}" if self.plan.shape.hybrid else "")

    def record(self) -> dict[str, Any]:
        """For the run's provenance (worker/engine/host.py ``settings``)."""
        plan = self.plan
        return {"kv_cache_tokens": self.tokens, "kv_cache_blocks": self.blocks,
                "kv_cache_sequences": round(self.sequences, 2), "kv_block_size": plan.block_size if plan else 0,
                "state_blocks_per_sequence": plan.state_groups * plan.state_blocks if plan else 0}


def engine_capacity(vllm_config: Any, max_model_len: int) -> EngineCapacity:
    """A built engine's capacity. Its tokens are vLLM's own figure where the engine reports it to its client
    (``kv_cache_size_tokens``: 0.26-0.33), else the plan's arithmetic, which gives the same. ``blocks x
    block_size``, what regen printed before, is right for a dense model only: a hybrid's states take blocks
    of the same pool (issue 56: 8,388,480 printed where vLLM logged 5,368,627)."""
    cache = getattr(vllm_config, "cache_config", None)
    if cache is None:
        return EngineCapacity()
    plan = engine_plan(vllm_config)
    try:
        blocks = int(getattr(cache, "num_gpu_blocks", 0) or 0)
        tokens = int(getattr(cache, "kv_cache_size_tokens", 0) or 0)
        if not tokens and blocks:
            tokens = plan.tokens(blocks, max_model_len) if plan and max_model_len else blocks * int(cache.block_size)
    except (AttributeError, TypeError, ValueError):
        return EngineCapacity(plan=plan)
    return EngineCapacity(tokens, blocks, max_model_len, plan)


def card_capacity(config: dict[str, Any], tokens: int, *, speculative_tokens: int = 0,
                  prefix_caching: bool = True) -> dict[str, dict[str, Any]]:
    """For the estimate: on each lent card alone, at vLLM's default share, the sequences of ``tokens`` the
    cache holds and what one costs (the model's bf16 weights; an assumption until a GPU's log measures it)."""
    out: dict[str, dict[str, Any]] = {}
    for card in CARD_BYTES:
        plan, blocks = plan_on_card(config, card, prefix_caching=prefix_caching, speculative_tokens=speculative_tokens)
        out[card] = {"sequences": round(plan.sequences(blocks, tokens), 1), "blocks": blocks,
                     "block_size": plan.block_size, "tokens_per_sequence": int(tokens),
                     "state_mib_per_sequence": round(plan.shape.state_bytes_per_sequence / 2**20, 1),
                     "kv_kib_per_token": round(plan.shape.kv_bytes_per_token / 1024, 1)}
    return out
