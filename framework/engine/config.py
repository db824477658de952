"""The options of the decoding loop, validated (:class:`DecodeConfig`).
"""

from __future__ import annotations

from typing import Any, Optional

from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError

#: the loop's KV-cache modes (``DecodeConfig.cache``): Fast-dLLM's two approximate caches for
#: full-attention models, and the exact cache of completed blocks for block-causal ones
CACHE_MODES = ("none", "prefix", "dual", "block")
#: the cache modes each canvas layout has a meaning for
LAYOUT_CACHE_MODES = {"full": ("none", "prefix", "dual"), "block-causal": ("none", "block")}
#: how a verifying controller's ``features.verify_prob`` is computed (``DecodeConfig.verification``)
VERIFICATIONS = ("shadow", "probe")
#: options added after results files began recording a settings hash, with the default that keeps the
#: earlier behaviour: left out of that hash at this default, so earlier files still resume
LATER_DEFAULTS = {"verification": "shadow", "eos_stop": None, "sub_block_cache": None,
                  "block_add_threshold": None}
#: options removed from the loop after results files began recording a settings hash, with the value
#: those files recorded (the default then): put back into that hash, so earlier files still resume
REMOVED_DEFAULTS = {"lookahead_budget": 64}
#: options that moved elsewhere: setting one fails with where it went
MOVED = {"lookahead_budget": "the lookahead's budget: `lookahead: {budget: N}` in an experiment config, "
                             "`--lookahead budget=N` on the command line, `Lookahead(budget=N)` in Python"}


class DecodeConfig(Configurable):
    """Options of the loop (set with ``--set key=value`` next to the controller's own).

    Args:
        gen_length: number of generated positions G.
        block_length: semi-autoregressive block length (LLaDA's ``block_length``); ``None`` = G.
            Must divide ``gen_length``. On a block-causal model (LLaDA2.x, SDAR, Fast-dLLM v2) the
            blocks are the model's: ``None`` or the block size it was trained with (anything else is
            refused), aligned from position 0 of the canvas, so the prompt's last partial block is
            decoded with the first generated positions and G need not be a multiple of it.
        temperature: 0 = greedy argmax; > 0 = sampling of x0 from ``softmax(logits / T)``, by
            inverse CDF in float64 from one counter-based uniform per (seed, step, position): the
            distribution of LLaDA's float64 Gumbel-max (:func:`adaptive_decoding.framework.engine.features.sample_tokens`).
        eos_fill: end-of-text prediction: after an EOS is committed with confidence ≥
            ``eos_fill_threshold``, every later masked position is filled with EOS and never decoded.
        eos_fill_threshold: the confidence an EOS needs to trigger the fill.
        seed: base seed; per-sample seeds default to it.
        cache: the KV cache, with Fast-dLLM's semantics (invisible to controllers): ``none``
            runs the whole canvas every step; ``prefix`` refreshes the cache with one full forward
            at each block start (its logits serve that step), then runs the block and everything
            after it against the cached prefix; ``dual`` runs only the block, the suffix's keys
            and values stale until the next refresh; ``block`` (block-causal models only) is the
            exact cache of completed blocks: each step runs the current block against it, and a
            block's first step also re-runs the block before it, whose final keys and values it
            stores (no extra forward). Every forward counts as one NFE.
        cache_refresh: also refresh every this many steps inside a block too (``None`` = at block
            starts only, as Fast-dLLM; 1 = every step, which equals ``cache=none``).
        sub_block_cache: Fast-dLLM v2's approximate sub-block cache (its ``use_block_cache``) on top of
            ``cache='block'``, with sub-blocks of this many positions (dividing the model's block size);
            ``None`` = off (the exact cache alone). Inside a block, the first sub-block with a masked
            position runs alone against the block's keys and values frozen at the last full forward of
            the block (the other positions keep that forward's logits) once the sub-block's first
            position is decided; see :class:`adaptive_decoding.framework.engine.denoise.CacheSession`. Approximate: the
            tokens may differ from the exact decode's; the forwards are as many, each over s positions.
        remask_budget: revocable decoding: most re-masked tokens per sample over the whole decode
            (``None`` = ``gen_length``). Every step commits at least one masked position, so a
            sample takes at most ``gen_length + remask_budget`` steps.
        remask_per_position: most times one position may be re-masked.
        verification: for controllers that ``verify``: ``shadow`` (WINO's shadow block in the step's
            own forward where the model has one, else exact probes) or ``probe`` (always exact: one
            forward per verified slot with that slot masked, each counted in NFE).
        eos_stop: a row ends after a block that contains end-of-text (its remaining positions
            become end-of-text, never decoded), as LLaDA2.0's ``generate`` does; ``None`` = on for
            block-causal models, off for full-attention ones.
        block_add_threshold: multi-block decoding (d3LLM's ``generate_multi_block``): several blocks
            active at once; the next block joins the window when the last active one is at least this
            fraction decided (1 − masked / length ≥ it), at most one a step, and at once when the last
            one is decided. The window spans the active blocks, from the first with a masked position
            (features' ``block_of`` says which block a slot is in). 1.0 = one block at a time, today's
            decoding; ``None`` = the controller's ``default_block_add_threshold`` (``d3llm``: 0.1, as
            d3LLM's scripts), else one block at a time. No effect with a single block (``block_length``
            unset or equal to G).
    """

    params = {
        "gen_length": Param(int, low=1, doc="generated positions G"),
        "block_length": Param(int, low=1, nullable=True, doc="semi-AR block length (divides G); null = G"),
        "temperature": Param(float, low=0.0, doc="0 = greedy; > 0 = sampling from softmax(z / T)"),
        "eos_fill": Param(bool, doc="fill after a confident EOS (end-of-text prediction)"),
        "eos_fill_threshold": Param(float, low=0.0, high=1.0, doc="confidence an EOS needs to fill"),
        "seed": Param(int, low=0, doc="base seed"),
        "cache": Param(str, choices=CACHE_MODES,
                       doc="KV cache: none | prefix | dual (Fast-dLLM) | block (exact, block-causal models)"),
        "cache_refresh": Param(int, low=1, nullable=True,
                               doc="refresh the cache every N steps in a block too; null = block starts only"),
        "sub_block_cache": Param(int, low=1, nullable=True,
                                 doc="with cache=block: Fast-dLLM v2's approximate sub-block cache, sub-blocks of "
                                     "N positions (use_block_cache); null = off (exact)"),
        "remask_budget": Param(int, low=0, nullable=True,
                               doc="revocable decoding: most re-masks per sample; null = gen_length"),
        "remask_per_position": Param(int, low=0, doc="revocable decoding: most re-masks of one position"),
        "verification": Param(str, choices=VERIFICATIONS,
                              doc="verify_prob by WINO's shadow block (one forward) or exact probes (one a slot)"),
        "eos_stop": Param(bool, nullable=True,
                          doc="end a row after a block containing end-of-text; null = on for block-causal models"),
        "block_add_threshold": Param(float, low=0.0, high=1.0, nullable=True,
                                     doc="multi-block: open the next block when the last active one is this "
                                         "fraction decided; 1 = one block at a time; null = the controller's default"),
    }

    def __init__(
        self,
        gen_length: int = 32,
        block_length: Optional[int] = None,
        temperature: float = 0.0,
        eos_fill: bool = False,
        eos_fill_threshold: float = 0.9,
        seed: int = 0,
        cache: str = "none",
        cache_refresh: Optional[int] = None,
        remask_budget: Optional[int] = None,
        remask_per_position: int = 2,
        verification: str = "shadow",
        eos_stop: Optional[bool] = None,
        sub_block_cache: Optional[int] = None,
        block_add_threshold: Optional[float] = None,
    ) -> None:
        self.gen_length = gen_length
        self.block_length = block_length
        self.temperature = temperature
        self.eos_fill = eos_fill
        self.eos_fill_threshold = eos_fill_threshold
        self.seed = seed
        self.cache = cache
        self.cache_refresh = cache_refresh
        self.remask_budget = remask_budget
        self.remask_per_position = remask_per_position
        self.verification = verification
        self.eos_stop = eos_stop
        self.sub_block_cache = sub_block_cache
        self.block_add_threshold = block_add_threshold
        #: the canvas layout of the model this configuration decodes (set by :meth:`for_layout`)
        self.layout = "full"

    @classmethod
    def build(cls, **params: Any) -> "DecodeConfig":
        """Construct and validate; an option in :data:`MOVED` fails with where it went."""
        for key in params:
            if key in MOVED:
                raise ParameterError(f"{key} is no longer a decoding option; it is now {MOVED[key]}")
        return super().build(**params)  # type: ignore[return-value]

    def for_layout(self, layout: str, block_size: Optional[int] = None) -> "DecodeConfig":
        """This configuration for a model of canvas ``layout`` (``full`` or ``block-causal``), checked:
        on a block-causal model the blocks are the model's ``block_size`` (``block_length`` must be
        ``None`` or equal to it) and the cache mode one with a meaning there. Returns a copy."""
        import copy

        allowed = LAYOUT_CACHE_MODES[layout]
        if self.cache not in allowed:
            why = ("is the exact cache of a block-causal model's completed blocks" if self.cache == "block"
                   else "is Fast-dLLM's approximate cache for full-attention models; a block-causal model's "
                        "completed blocks are cached exactly by cache='block'")
            raise ParameterError(f"cache={self.cache!r} does not apply to a {layout} model: it {why}; allowed: "
                                 f"{', '.join(allowed)}")
        out = copy.copy(self)
        out.layout = layout
        if layout == "block-causal":
            if self.block_length not in (None, block_size):
                raise ParameterError(f"block_length={self.block_length} is not the block size this block-causal "
                                     f"model was trained with; allowed: {block_size} (or null for it)")
            out.block_length = int(block_size)
            check_sub_block(self.sub_block_cache, int(block_size))
        out.validate()
        return out

    def check_combination(self) -> None:
        if self.cache == "none" and self.cache_refresh is not None:
            self.warn_no_effect("cache_refresh", "cache='none' keeps no cache to refresh")
        if self.cache == "block" and self.cache_refresh is not None:
            self.warn_no_effect("cache_refresh", "cache='block' is exact: nothing to refresh")
        if self.sub_block_cache is not None and self.cache != "block":
            raise ParameterError(f"sub_block_cache={self.sub_block_cache} needs cache='block' (it freezes the current "
                                 f"block's keys and values on top of the exact cache of a block-causal model's "
                                 f"completed blocks), got cache={self.cache!r}; allowed with it: null (off)")
        bl = self.block_length
        if self.block_add_threshold is not None and (bl is None or bl >= self.gen_length):
            self.warn_no_effect("block_add_threshold", "the generation is one block (block_length unset or = G)")
        if bl is not None and getattr(self, "layout", "full") == "full":
            if bl > self.gen_length or self.gen_length % bl != 0:
                raise ParameterError(
                    f"block_length={bl} does not divide gen_length={self.gen_length}; "
                    f"allowed: a divisor of {self.gen_length} "
                    f"({', '.join(str(d) for d in _divisors(self.gen_length))}); on a block-causal model "
                    f"(LLaDA2.x, SDAR, Fast-dLLM v2) leave block_length unset: its trained block size is used"
                )

    @property
    def effective_block_length(self) -> int:
        return self.block_length or self.gen_length

    @property
    def block_causal(self) -> bool:
        """Whether the model decoded is block-causal (blocks aligned from position 0, :meth:`for_layout`)."""
        return getattr(self, "layout", "full") == "block-causal"

    @property
    def stops_at_eos_block(self) -> bool:
        """``eos_stop``, or by default whether the model is block-causal."""
        return self.block_causal if self.eos_stop is None else bool(self.eos_stop)

    @property
    def effective_remask_budget(self) -> int:
        """Most re-masks per sample (``remask_budget``, default ``gen_length``)."""
        return self.gen_length if self.remask_budget is None else int(self.remask_budget)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.effective_block_length


def check_sub_block(sub_block: Optional[int], block_size: int) -> None:
    """Refuse a sub-block length s that does not divide the model's block size b (Fast-dLLM v2 decodes
    ``b // s`` sub-blocks; the positions past them would never be decoded)."""
    if sub_block is not None and block_size % int(sub_block) != 0:
        raise ParameterError(f"sub_block_cache={sub_block} does not divide the block size {block_size} this "
                             f"block-causal model was trained with; allowed: "
                             f"{', '.join(str(d) for d in _divisors(block_size))} (or null: off)")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
