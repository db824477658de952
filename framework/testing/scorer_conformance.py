"""One conformance suite for every scorer (the counterpart of :mod:`adaptive_decoding.framework.testing.conformance`).

A plugin author runs it on their scorer, registered or not::

    from adaptive_decoding.framework.testing.scorer_conformance import check_scorer
    check_scorer("my_scorer")                      # a registered name, or the class itself

The checks (:func:`scorer_checks` yields them in this order), on a fixed batch of hand-made
candidates (:func:`conformance_batch`: character-level texts, ragged prompts, partly masked rows,
recorded log-probabilities, a tiny causal LM in ``context.resources``):

``implements``         no abstract method of ``Scorer`` left undefined (``_score``).
``params_declared``    every ``__init__`` keyword has a :class:`~adaptive_decoding.framework.core.params.Param` and vice
                       versa, values are stored as given, the defaults validate, a docstring.
``param_validation``   an out-of-range / unknown-choice / non-boolean value of each Param is refused
                       by ``build`` with a :class:`ParameterError` naming the parameter; an unknown
                       parameter name is refused, listing the known ones.
``round_trip``         ``cls(**s.get_params())`` equals ``s`` and scores identically.
``contract``           ``score`` returns float ``[N]``, finite, within ``bounds()``.
``determinism``        two calls (and a fresh instance) give identical scores.
``batch_invariance``   the scores of the whole batch equal those of each candidate scored alone
                       and of any permutation (a score is a property of one candidate).
``edge_cases``         finite scores of the right shape for N = 0, G = 0, fully masked candidates
                       (every position undecided) and candidates of special tokens only.

Hooks (classmethods a scorer class may define): ``conformance_params() -> dict``, the parameters
the suite builds it with (e.g. a light embedding model; default ``{}``), and
``conformance_batch() -> (Candidates, ScoringContext)``, the candidates of the scorer's domain
when the fixed texts are not (e.g. Sudoku grids for a rule checker); its context must carry a
tokenizer with ``mask_token_id`` and ``eos_token_id``, and its candidates recorded log-probabilities.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Iterator

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext
from adaptive_decoding.framework.testing.toys import CharTokenizer

TEXTS = (
    "a 256GB laptop, the cheapest",
    "a 265GB laptop for work",
    "the the the the the",
    "fast SSD, quiet fan",
    "",
    "ok",
)
PROMPTS = ("buy a 256GB laptop:", "laptop?", "say it:", "ssd: ")
ATOL = 1e-5

Check = Callable[[Any], None]


class ScorerConformanceError(AssertionError):
    """A scorer broke a contract; the message names the scorer, the check and the evidence."""


def _fail(msg: str) -> None:
    raise ScorerConformanceError(msg)


def _resolve(cls_or_name: Any) -> type:
    return SCORERS.get(cls_or_name) if isinstance(cls_or_name, str) else cls_or_name


def _params(cls: type) -> dict[str, Any]:
    hook = getattr(cls, "conformance_params", None)
    return dict(hook()) if callable(hook) else {}


def _make(cls: type, **override: Any) -> Scorer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.build(**{**_params(cls), **override})


def _batch(cls: type) -> tuple[Candidates, ScoringContext]:
    hook = getattr(cls, "conformance_batch", None)
    return hook() if callable(hook) else conformance_batch()


def conformance_batch() -> tuple[Candidates, ScoringContext]:
    """The fixed candidates and context every check uses (see the module docstring)."""
    from adaptive_decoding.framework.training.causal_lm import CausalConfig, CausalLM

    tok = CharTokenizer()
    g = max(len(t) for t in TEXTS) + 2
    n = len(TEXTS)
    tokens = torch.full((n, g), tok.eos_token_id, dtype=torch.long)
    for i, t in enumerate(TEXTS):
        ids = tok.encode(t)
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long) if ids else tokens[i, :0]
    decided = torch.ones(n, g, dtype=torch.bool)
    decided[1, 4:7] = False  # a partly decided candidate
    decided[5] = False  # a fully masked one
    tokens = torch.where(decided, tokens, torch.full_like(tokens, tok.mask_token_id))
    plist = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    p = max(len(x) for x in plist)
    prompt_ids = torch.full((n, p), tok.pad_token_id, dtype=torch.long)
    for i, x in enumerate(plist):
        prompt_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    pmask = torch.arange(p)[None, :] < torch.tensor([len(x) for x in plist])[:, None]
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(n, g, generator=gen) * 3
    cands = Candidates(tokens=tokens, source=torch.arange(n) % 4, prompt_ids=prompt_ids, prompt_mask=pmask,
                       decided=decided, logprobs=logprobs, logprob_mask=decided.clone())
    torch.manual_seed(0)
    lm = CausalLM(CausalConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                               mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                               max_len=p + g, d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    meta = [{"copy_numbers": ["256GB"], "task": "toy"} for _ in range(4)]
    return cands, ScoringContext(tokenizer=tok, meta=meta, resources={"causal_lm": lm})


def _score(s: Scorer, c: Candidates, ctx: ScoringContext) -> torch.Tensor:
    with torch.no_grad():
        return s.score(c, ctx)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=ATOL, rtol=0))


# ---------------------------------------------------------------------- the checks
def check_params_declared(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    name = cls.display_name()
    kw = set(cls.param_names())
    if kw != set(cls.params):
        _fail(f"{name}: __init__ keywords {sorted(kw)} differ from the declared params {sorted(cls.params)}")
    if not (cls.__doc__ or "").strip():
        _fail(f"{name}: no docstring (its first line is what 'adec list scorers' shows)")
    defaults = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
                if p.name in kw and p.default is not p.empty}
    obj = cls(**defaults)
    for k, v in defaults.items():
        if getattr(obj, k) is not v:
            _fail(f"{name}: __init__ does not store {k} as given (logic in __init__?)")
    _make(cls)


def _bad_values(spec: Param) -> list[Any]:
    if spec.choices is not None:
        return ["__not_a_choice__"]
    if spec.kind is bool:
        return ["maybe"]
    out: list[Any] = []
    if spec.kind in (int, float):
        if spec.low is not None:
            out.append(spec.low - 1 if not spec.low_exclusive else spec.low)
        if spec.high is not None:
            out.append(spec.high + 1)
        out.append("not-a-number")
    return out


def check_param_validation(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    name = cls.display_name()
    for pname, spec in cls.params.items():
        for bad in _bad_values(spec):
            try:
                _make(cls, **{pname: bad})
            except ParameterError as exc:
                if pname not in str(exc):
                    _fail(f"{name}: the error for {pname}={bad!r} does not name the parameter: {exc}")
            else:
                _fail(f"{name}: {pname}={bad!r} was accepted; allowed: {spec.allowed()}")
    try:
        _make(cls, no_such_parameter=1)
    except ParameterError as exc:
        if "no_such_parameter" not in str(exc):
            _fail(f"{name}: the unknown-parameter error does not name it: {exc}")
    else:
        _fail(f"{name}: an unknown parameter name was accepted")


def check_implements(cls_or_name: Any) -> None:
    """No abstract method of :class:`~adaptive_decoding.framework.engine.scorer.Scorer` is left undefined (``_score``)."""
    cls = _resolve(cls_or_name)
    if inspect.isabstract(cls):
        _fail(f"{cls.display_name()}: does not implement {', '.join(sorted(cls.__abstractmethods__))} "
              f"(abstract in Scorer)")


def check_round_trip(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    s = _make(cls)
    twin = cls(**s.get_params())
    twin.validate()
    if twin != s:
        _fail(f"{cls.display_name()}: cls(**get_params()) differs: {twin!r} vs {s!r}")
    c, ctx = _batch(cls)
    if not _close(_score(s, c, ctx), _score(twin, c, ctx)):
        _fail(f"{cls.display_name()}: the round-tripped scorer scores differently")


def check_contract(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    s = _make(cls)
    c, ctx = _batch(cls)
    out = _score(s, c, ctx)
    lo, hi = s.bounds()
    if out.shape != (c.n,) or not out.dtype.is_floating_point:
        _fail(f"{cls.display_name()}: score returned {tuple(out.shape)} {out.dtype}; expected float ({c.n},)")
    if not torch.isfinite(out).all():
        _fail(f"{cls.display_name()}: non-finite scores {out.tolist()}")
    if (out < lo - ATOL).any() or (out > hi + ATOL).any():
        _fail(f"{cls.display_name()}: scores {out.tolist()} leave the bounds [{lo}, {hi}]")


def check_determinism(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    c, ctx = _batch(cls)
    a = _score(_make(cls), c, ctx)
    s = _make(cls)
    b, b2 = _score(s, c, ctx), _score(s, c, ctx)
    if not (_close(a, b) and _close(b, b2)):
        _fail(f"{cls.display_name()}: scores differ between calls: {a.tolist()} / {b.tolist()} / {b2.tolist()}")


def check_batch_invariance(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    s = _make(cls)
    c, ctx = _batch(cls)
    whole = _score(s, c, ctx)
    alone = torch.cat([_score(s, c.select(torch.tensor([i])), ctx) for i in range(c.n)])
    if not _close(whole, alone):
        _fail(f"{cls.display_name()}: batch scores {whole.tolist()} differ from single scores {alone.tolist()}")
    perm = torch.tensor(list(reversed(range(c.n))))
    permuted = _score(s, c.select(perm), ctx)
    if not _close(permuted, whole[perm]):
        _fail(f"{cls.display_name()}: scores depend on the order of the candidates")
    pair = Candidates.cat([c.select(torch.tensor([0])), c.select(torch.tensor([3]))])
    if not _close(_score(s, pair, ctx), whole[torch.tensor([0, 3])]):
        _fail(f"{cls.display_name()}: scores depend on the other candidates of the batch")


def check_edge_cases(cls_or_name: Any) -> None:
    cls = _resolve(cls_or_name)
    s = _make(cls)
    c, ctx = _batch(cls)
    name = cls.display_name()
    empty = c.select(torch.zeros(0, dtype=torch.long))
    out = _score(s, empty, ctx)
    if out.shape != (0,):
        _fail(f"{name}: N = 0 gave shape {tuple(out.shape)}; expected (0,)")
    zero_g = Candidates(tokens=c.tokens[:, :0], source=c.source, prompt_ids=c.prompt_ids, prompt_mask=c.prompt_mask,
                        decided=c.decided[:, :0], logprobs=c.logprobs[:, :0], logprob_mask=c.logprob_mask[:, :0])
    tok = ctx.tokenizer
    masked = Candidates(tokens=torch.full_like(c.tokens, tok.mask_token_id), source=c.source, prompt_ids=c.prompt_ids,
                        prompt_mask=c.prompt_mask, decided=torch.zeros_like(c.decided), logprobs=c.logprobs,
                        logprob_mask=torch.zeros_like(c.decided))
    specials = Candidates(tokens=torch.full_like(c.tokens, tok.eos_token_id), source=c.source,
                          prompt_ids=c.prompt_ids, prompt_mask=c.prompt_mask, decided=c.decided,
                          logprobs=c.logprobs, logprob_mask=c.logprob_mask)
    for label, cand in (("G = 0", zero_g), ("fully masked", masked), ("special tokens only", specials)):
        out = _score(s, cand, ctx)
        if out.shape != (cand.n,) or not torch.isfinite(out).all():
            _fail(f"{name}: {label} candidates gave {out.tolist()} (shape {tuple(out.shape)}); expected finite ({cand.n},)")


_CHECKS: tuple[tuple[str, Check], ...] = (
    ("implements", check_implements),
    ("params_declared", check_params_declared),
    ("param_validation", check_param_validation),
    ("round_trip", check_round_trip),
    ("contract", check_contract),
    ("determinism", check_determinism),
    ("batch_invariance", check_batch_invariance),
    ("edge_cases", check_edge_cases),
)


def scorer_checks() -> Iterator[tuple[str, Check]]:
    """``(check name, check)`` pairs, in order; each check takes a class or a registered name."""
    yield from _CHECKS


def check_scorer(cls_or_name: Any) -> None:
    """Run every check; raise :class:`ScorerConformanceError` at the first broken contract."""
    for _, check in scorer_checks():
        check(cls_or_name)
