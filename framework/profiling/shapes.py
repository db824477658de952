"""The block-causal models ``adec profile --arch`` builds at their real shapes (random weights).

Each entry is the ``config.json`` of a released checkpoint, as far as the forward depends on it,
read by the architecture's own ``from_hf_config``: LLaDA2.0-mini (dFactory
``configs/model_configs/llada2_mini/config.json``, docs/models.md), SDAR-1.7B-Chat and Fast-dLLM v2
1.5B (the Qwen3-1.7B and Qwen2.5-1.5B bodies they are fine-tuned from; see :data:`ASSUMED`). On CPU
the layers are cut (``layers``): the width, heads, experts, vocabulary and block size stay real,
so a step's attention, MLP/MoE and LM-head shapes are the real ones, only fewer layers of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from adaptive_decoding.framework.models.arch.fast_dllm_v2 import FastDLLMv2Model
from adaptive_decoding.framework.models.arch.llada2 import LLaDA2MoeModel
from adaptive_decoding.framework.models.arch.sdar import SDARModel
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

#: the default ``--arch``: LLaDA-8B's architecture with a configurable body (:func:`adaptive_decoding.framework.profiling.profile_model`)
FULL_ARCH = "llada"


@dataclass(frozen=True)
class ArchShape:
    """A block-causal model at a released checkpoint's shapes: its class, ``config.json`` and caveats."""

    name: str  # what the profile header calls it
    model_class: type
    config: dict[str, Any]
    min_layers: int = 1  # the fewest layers that still hold every kind of layer (LLaDA2: a dense and an MoE)
    assumed: tuple[str, ...] = field(default=())  # values not read from the released config

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])


LLADA2_MINI = ArchShape(
    name="LLaDA2-MoE at LLaDA2.0-mini's shapes", model_class=LLaDA2MoeModel, min_layers=2,
    config={"model_type": "llada2_moe", "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 5120, "first_k_dense_replace": 1,
            "num_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
            "moe_intermediate_size": 512, "num_shared_experts": 1, "routed_scaling_factor": 2.5,
            "moe_router_enable_expert_bias": True, "partial_rotary_factor": 0.5, "rope_theta": 600000,
            "rms_norm_eps": 1e-6, "vocab_size": 157184, "tie_word_embeddings": False, "use_qk_norm": True,
            "max_position_embeddings": 32768, "pad_token_id": 156892, "block_size": 32,
            "mask_token_id": 156895, "eos_token_id": 156892},  # the ids generate() defaults to
)
SDAR_1_7B = ArchShape(
    name="SDAR at SDAR-1.7B's shapes", model_class=SDARModel,
    config={"model_type": "sdar", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "block_size": 4, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "attention_bias": False, "mask_token_id": 151669, "eos_token_id": 151643,
            "max_position_embeddings": 32768},
    assumed=("the body is Qwen3-1.7B's (hidden 2048, 28 layers, 16 heads / 8 KV heads, head dim 128, MLP 6144, "
             "vocabulary 151,936, tied embeddings): SDAR-1.7B-Chat's own config.json was not read (docs/models.md "
             "cites the 4B and 8B ones)", "block 4, SDAR-Chat's default (checkpoints exist per block size)"),
)
FAST_DLLM_V2_1_5B = ArchShape(
    name="Fast-dLLM v2 at its 1.5B shapes", model_class=FastDLLMv2Model,
    config={"model_type": "Fast_dLLM_Qwen", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "bd_size": 32,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "eos_token_id": 151645,
            "mask_token_id": 151665,
            "max_position_embeddings": 32768},
    assumed=("the body is Qwen2.5-1.5B-Instruct's (hidden 1536, 28 layers, 12 heads / 2 KV heads, head dim 128, "
             "MLP 8960, vocabulary 151,936, tied embeddings), which Fast-dLLM v2 1.5B is fine-tuned from; its own "
             "config.json was not read", ),
)
ARCHS: dict[str, ArchShape] = {"llada2": LLADA2_MINI, "sdar": SDAR_1_7B, "fast_dllm_v2": FAST_DLLM_V2_1_5B}
ARCH_NAMES = (FULL_ARCH, *ARCHS)


def check_arch(arch: str) -> ArchShape:
    """The shape of block-causal ``arch``; an unknown name fails naming the allowed ones."""
    if arch not in ARCHS:
        raise ValueError(f"unknown profile arch {arch!r}; allowed: {', '.join(ARCH_NAMES)}")
    return ARCHS[arch]


def arch_config(arch: str, layers: Optional[int] = None, overrides: Optional[dict[str, Any]] = None
                ) -> dict[str, Any]:
    """``arch``'s ``config.json`` with ``layers`` layers (cut; default all) and ``overrides`` (config keys:
    a tiny body for tests); an override of a key the config lacks fails naming the keys."""
    shape = check_arch(arch)
    config = dict(shape.config)
    unknown = sorted(set(overrides or {}) - set(config))
    if unknown:
        raise ValueError(f"unknown {arch} config key(s) {unknown}; allowed: {', '.join(sorted(config))}")
    config.update(overrides or {})
    if layers is not None:
        if layers < shape.min_layers:
            raise ValueError(f"--layers {layers} is too few for {arch}: at least {shape.min_layers} (layer 0 is dense, "
                             "the others MoE)" if shape.min_layers > 1 else f"--layers {layers}: at least 1")
        config["num_hidden_layers"] = int(layers)
    return config


def _init_random(model: torch.nn.Module, seed: int) -> None:
    """Random weights: matrices N(0, 0.02), norm weights 1, biases 0 (the router's expert bias too)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(std=0.02)
            else:
                p.fill_(1.0 if "norm" in name else 0.0)


def block_profile_model(arch: str, layers: Optional[int] = None, device: "str | torch.device" = "cpu",
                        dtype: torch.dtype = torch.float32, seed: int = 0,
                        overrides: Optional[dict[str, Any]] = None) -> OwnArchitectureDenoiser:
    """``arch`` (``llada2``, ``sdar``, ``fast_dllm_v2``) built from its config (:func:`arch_config`) on
    ``device`` in ``dtype`` with random weights, as the denoiser the engine decodes (block-causal)."""
    shape = check_arch(arch)
    config = shape.model_class.config_class.from_hf_config(arch_config(arch, layers, overrides))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built where it runs (a GPU's body never passes through host memory)
            model = shape.model_class(config)
    finally:
        torch.set_default_dtype(default)
    _init_random(model, seed)
    model = model.eval().requires_grad_(False)
    return OwnArchitectureDenoiser(model, mask_token_id=config.mask_token_id, vocab_size=config.vocab_size,
                                   eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)


def describe(arch: str, model: Any, overrides: Optional[dict[str, Any]] = None) -> str:
    """The header's model description: the shapes, how many of the real layers, what was assumed."""
    shape = check_arch(arch)
    c = model.model.config
    n = c.num_hidden_layers
    parts = [f"{shape.name}: hidden {c.hidden_size}, {c.num_attention_heads} heads / {c.num_key_value_heads} KV heads, "
             f"head dim {c.head_dim or c.hidden_size // c.num_attention_heads}"]
    if arch == "llada2":
        parts.append(f"{c.num_experts} experts of {c.moe_intermediate_size} top-{c.num_experts_per_tok} "
                     f"({c.n_group} groups, {c.topk_group} kept) + {c.num_shared_experts} shared, dense MLP "
                     f"{c.intermediate_size} on the first {c.first_k_dense_replace} layer(s)")
    else:
        parts.append(f"MLP {c.intermediate_size}")
    parts.append(f"vocab {c.vocab_size}, block {model.block_size}")
    cut = (f"{n} of its {shape.layers} layers (cut{' on CPU' if model.device.type == 'cpu' else ''}"
           f"{'; layer 0 dense, the rest MoE' if arch == 'llada2' else ''})" if n < shape.layers
           else f"all {n} layers")
    parts.append(cut)
    if overrides:
        parts.append("overridden: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())))
    parts.append(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, random")
    text = ", ".join(parts)
    if shape.assumed and not overrides:
        text += "; assumed: " + "; ".join(shape.assumed)
    return text
