"""The options of ``adec profile`` (:mod:`adaptive_decoding.framework.profiling`), grouped by concern
(:mod:`adaptive_decoding.framework.core.options`):

* :class:`ProfileArch`: the LLaDA-architecture body :func:`adaptive_decoding.framework.profiling.profile_model` builds
  (vocabulary, width, layers, heads, SwiGLU width, the weights' seed, query chunking);
* :class:`ProfileOptions` of :func:`adaptive_decoding.framework.profiling.run_profile`, in two groups: ``shapes`` (the
  batch sizes, prompt, generation and block lengths, LLaDA's steps) and ``sweep`` (the cache modes,
  temperatures and loops measured, and how many timed runs each).

``adec profile`` builds both once from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from adaptive_decoding.framework.core.options import ChoiceListParam, IntListParam, OptionGroups, Options
from adaptive_decoding.framework.core.params import NumberListParam, Param, ParameterError

#: LLaDA's vocabulary (126,464 ids; its mask id 126,336)
LLADA_VOCAB = 126464
#: the loops a profile can time: the framework's decode, a bare block-only loop, decode with WINO's verification
LOOPS = ("decode", "bare", "verify")
CACHES = ("none", "prefix", "dual", "block")


@dataclass(repr=False, eq=False)
class ProfileArch(Options):
    """A LLaDA-architecture body with random weights drawn with ``seed``: ``vocab_size`` ids (the mask
    is LLaDA's id when the vocabulary holds it, else the last id), ``d_model`` wide, ``n_layers``
    layers of ``n_heads`` heads, a SwiGLU of ``mlp_hidden``; full forwards taken ``query_chunk``
    query rows at a time when given."""

    section = "arch"
    params = {
        "vocab_size": Param(int, low=2, doc="vocabulary size (LLaDA's: 126,464)"),
        "d_model": Param(int, low=1, doc="model width"),
        "n_layers": Param(int, low=1, doc="layers"),
        "n_heads": Param(int, low=1, doc="attention heads (as many key-value heads)"),
        "mlp_hidden": Param(int, low=1, doc="SwiGLU hidden width"),
        "seed": Param(int, low=0, doc="seed of the random weights"),
        "query_chunk": Param(int, low=1, nullable=True, doc="query rows per chunk of a full forward; null = one pass"),
    }

    vocab_size: int = LLADA_VOCAB
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    mlp_hidden: int = 1024
    seed: int = 0
    query_chunk: Optional[int] = None

    def check_combination(self) -> None:
        if self.d_model % self.n_heads:
            raise ParameterError(f"arch.n_heads={self.n_heads} does not divide arch.d_model={self.d_model}; "
                                 f"allowed: a divisor of {self.d_model}")


@dataclass(repr=False, eq=False)
class ProfileShapes(Options):
    """The decoded shapes: each batch size of ``batches`` decodes that many random prompts of
    ``prompt_length`` tokens into ``gen_length`` positions in blocks of ``block_length`` with LLaDA's
    rule in ``steps`` steps (null = ``gen_length // 4``: four tokens per step)."""

    section = "shapes"
    params = {
        "batches": IntListParam(low=1, doc="batch sizes"),
        "prompt_length": Param(int, low=1, doc="prompt tokens"),
        "gen_length": Param(int, low=1, doc="generated positions"),
        "block_length": Param(int, low=1, doc="semi-autoregressive block length"),
        "steps": Param(int, low=1, nullable=True, doc="LLaDA's steps in all; null = gen_length // 4"),
    }

    batches: Any = (1, 8)
    prompt_length: int = 256
    gen_length: int = 256
    block_length: int = 32
    steps: Optional[int] = None


@dataclass(repr=False, eq=False)
class ProfileSweep(Options):
    """What is measured: each cache mode of ``caches`` (null = every mode the model's layout has) and
    temperature, through each of ``loops``; times are medians of ``repeats`` runs."""

    section = "sweep"
    params = {
        "caches": ChoiceListParam(choices=CACHES, nullable=True, doc="cache modes; null = the layout's every mode"),
        "temperatures": NumberListParam(doc="sampling temperatures"),
        "loops": Param(object, doc="loops timed: decode, bare, verify"),
        "repeats": Param(int, low=1, doc="timed runs per configuration (medians)"),
    }

    caches: Any = None
    temperatures: Any = (0.0, 1.0)
    loops: Any = ("decode", "bare")
    repeats: int = 3

    def check_combination(self) -> None:
        """An unknown loop fails naming the known ones (``run_profile``'s own message)."""
        self.loops = [self.loops] if isinstance(self.loops, str) else list(self.loops)
        unknown = [name for name in self.loops if name not in LOOPS]
        if unknown:
            raise ParameterError(f"unknown profile loop(s) {unknown}; allowed: {', '.join(LOOPS)}")


@dataclass(repr=False, eq=False)
class ProfileOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.profiling.run_profile`, by concern."""

    shapes: ProfileShapes = field(default_factory=ProfileShapes)
    sweep: ProfileSweep = field(default_factory=ProfileSweep)
