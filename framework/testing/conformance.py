"""One conformance suite for every controller, like scikit-learn's ``check_estimator``.

A plugin author runs it on their controller, registered or not::

    from adaptive_decoding.framework.testing.conformance import check_controller
    check_controller("my_controller")          # a registered name, or the class itself

or, in pytest, one test per check (readable ids, one failure per broken contract)::

    @pytest.mark.parametrize("check_name, check", list(controller_checks()))
    def test_my_controller(check_name, check):
        check(MyController)

The checks (:func:`controller_checks` yields them in this order), all on small toy denoisers from
:mod:`adaptive_decoding.framework.testing`:

``implements``            no abstract method of ``Controller`` left undefined (``decide``); a class
                          that nests controllers (``ControllerSpec`` parameters) is a
                          ``Composite`` (:mod:`adaptive_decoding.framework.engine.nesting`), the one nesting mechanism, and a
                          Composite nests some; ``reference_param`` names one of its parameters.
``params_declared``       every ``__init__`` keyword has a :class:`~adaptive_decoding.framework.core.params.Param` and vice
                          versa, values are stored as given, the defaults validate, a docstring.
``param_validation``      for each bounded (or categorical, or boolean) Param, an out-of-range value
                          is accepted by ``__init__`` (no logic there) and refused by ``validate`` /
                          ``build`` with a :class:`ParameterError` naming the parameter, the value
                          and the allowed range; an unknown parameter name is refused.
``search_space``          every declared Optuna range lies inside the Param's bounds and its
                          endpoints (or choices) build.
``get_params_round_trip`` ``cls(**c.get_params())`` equals ``c``, also after decoding.
``save_load_round_trip``  :func:`adaptive_decoding.framework.engine.controller_io.save_controller` then ``load_controller``
                          gives an equal controller that decodes identically (needs a registered name).
``decision_fields``       Decision shapes and dtypes (commit ``[B, L]`` bool, tokens ``[B, L]`` valid
                          ids, k ``[B, L]`` ≥ 1 and 1 outside eligible, depth ``[B]`` ≥ 0,
                          next_block_length ``[B]`` ≥ 1, info and ``state.memory`` with leading dim B).
``batch_invariance``      a batch of N different, ragged prompts (with per-sample seeds) decodes
                          exactly like N single runs, greedy and sampled, on a context-dependent toy.
``determinism``           same seed, same decisions (also reusing one instance); a controller that
                          declares ``stochastic`` differs across seeds, one that does not ignores them.
``progress``              every step commits ≥ 1 position in every row that has eligible positions
                          (so ``DecodeResult.forced == 0``), on mixed, all-confident and
                          none-confident toys, and decoding finishes.
``decided_positions``     commits ⊆ ``features.eligible``; prompt and committed tokens never change
                          (a controller that ``edits`` may rewrite generated tokens, never the prompt).
``semi_ar_blocks``        all of the above hold inside semi-autoregressive blocks.
``revocable_bounds``      revocable decoding: ``Decision.remask`` only names ``features.revocable``
                          slots; a decided token changes only back to the mask (``decided_positions``);
                          with ``remask_budget=2, remask_per_position=1`` a sample re-masks at most
                          2 tokens, ends within ``gen_length + 2`` steps with nothing masked; a
                          controller that does not declare ``revocable`` re-masks nothing.
``block_causal_canvas``   on a block-causal toy (blocks of 3 aligned from position 0, so the prompts'
                          last partial blocks are shared): a ragged batch equals single runs, no step
                          is forced, nothing stays masked, and the exact block cache decodes exactly
                          as no cache (tokens and NFE), greedy and sampled.
``multi_block_window``    multi-block decoding (``block_add_threshold=0.5``, blocks of 2, so up to four
                          blocks are active at once) under every cache mode, greedy and sampled: no
                          step is forced, commits ⊆ eligible, nothing stays masked, a ragged batch
                          equals single runs.
``shadow_verification``   a controller that declares ``verifies``, on a 2-layer tiny transformer with
                          WINO's shadow block under every cache mode: one forward a step (NFE =
                          steps), a ragged batch equals single runs, decoding finishes.

Hooks a controller class may define:

* ``conformance_params() -> dict`` (classmethod): the keyword parameters the suite builds it with,
  for controllers that need extra construction (a learned policy's checkpoint); default ``{}``.
* ``conformance_expected_failures: dict[str, str]``: check name -> reason, for checks known to
  fail (scikit-learn's ``expected_failed_checks``): :func:`check_controller` runs them, warns, and
  does not raise; ``tests/test_conformance.py`` marks them ``xfail(strict=True)``.
"""

from __future__ import annotations

import copy
import inspect
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import ControllerSpec, ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.nesting import Composite
from adaptive_decoding.framework.testing.controller_harness import (
    PROMPTS,
    SEEDS,
    Check,
    ConformanceError,
    G,
    Recorder,
    bad_values,
    conformance_params_of,
    context_toy,
    describe_row,
    fail_check,
    flat_toys,
    harness_configs,
    make_controller,
    resolve_controller,
    run_recorded,
    same_row,
)


# ---------------------------------------------------------------------- the contract
def check_implements(cls_or_name: Any) -> None:
    """The class implements what a controller must, and nests others only the one way: no abstract
    method of :class:`~adaptive_decoding.framework.engine.controller.Controller` left undefined (``decide``); a class
    with :class:`~adaptive_decoding.framework.core.params.ControllerSpec` parameters is a
    :class:`~adaptive_decoding.framework.engine.nesting.Composite` (the one nesting mechanism, one memory rule), and a
    Composite declares one; ``reference_param``, when set, names one of its parameters."""
    cls = resolve_controller(cls_or_name)
    if inspect.isabstract(cls):
        fail_check(f"does not implement {', '.join(sorted(cls.__abstractmethods__))} (abstract in Controller)")
    specs = [n for n, p in cls.params.items() if isinstance(p, ControllerSpec)]
    if specs and not issubclass(cls, Composite):
        fail_check(f"parameters {specs} nest controllers, but the class is not a Composite (adaptive_decoding.framework.engine.nesting); "
                   f"subclass Composite (or Wrapper, for one inner controller) so the nested controllers are "
                   f"built, validated and kept in memory the one way")
    if issubclass(cls, Composite) and not specs:
        fail_check("is a Composite but declares no ControllerSpec parameter; a composite's children are its "
                   "ControllerSpec parameters")
    ref = getattr(cls, "reference_param", None)
    if ref is not None and ref not in cls.param_names():
        fail_check(f"reference_param={ref!r} names no parameter; known: {', '.join(cls.param_names()) or '(none)'}")


# ---------------------------------------------------------------------- parameter checks
def check_params_declared(cls_or_name: Any) -> None:
    """Every __init__ keyword has a Param and vice versa; values stored as given; defaults build."""
    cls = resolve_controller(cls_or_name)
    names, declared = cls.param_names(), set(cls.params)
    if set(names) != declared:
        fail_check(f"__init__ keywords {sorted(names)} differ from the Param specs in `params` {sorted(declared)}; "
              f"every hyper-parameter needs both")
    sig = inspect.signature(cls.__init__)
    missing = [n for n in names if sig.parameters[n].default is inspect.Parameter.empty and n not in conformance_params_of(cls)]
    if missing:
        fail_check(f"parameters {missing} have no default; give one or return them from conformance_params()")
    given = conformance_params_of(cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = cls(**given)
    for key, value in given.items():
        if getattr(raw, key, object()) is not value:
            fail_check(f"__init__ did not store {key}={value!r} as given (got {getattr(raw, key, None)!r}); "
                  f"keep logic out of __init__")
    obj = make_controller(cls)
    if not obj.describe():
        fail_check("has no docstring; its first line is what `adec list` shows")


def check_param_validation(cls_or_name: Any) -> None:
    """Out-of-range values are refused by validate() with parameter, value and range named."""
    cls = resolve_controller(cls_or_name)
    base = conformance_params_of(cls)
    for name, spec in cls.params.items():
        for bad in bad_values(spec):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    obj = cls(**{**base, name: bad})
            except Exception as exc:  # noqa: BLE001
                fail_check(f"__init__ raised {type(exc).__name__} for {name}={bad!r}; validation belongs in "
                      f"validate(), not __init__")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    obj.validate()
            except ParameterError as exc:
                msg = str(exc)
                lacking = [what for what, text in (("the parameter", name), ("the value", repr(bad)),
                                                   ("the allowed range", spec.allowed())) if text not in msg]
                if lacking:
                    fail_check(f"{name}={bad!r} was refused, but the message {msg!r} does not name "
                          f"{' or '.join(lacking)} ({spec.allowed()!r})")
            except Exception as exc:  # noqa: BLE001
                fail_check(f"{name}={bad!r} raised {type(exc).__name__} ({exc}), expected ParameterError")
            else:
                fail_check(f"{name}={bad!r} is outside the declared range ({spec.allowed()}) but validate() accepted it")
    try:
        cls.build(**base, no_such_parameter=1)
    except ParameterError as exc:
        if "no_such_parameter" not in str(exc):
            fail_check(f"an unknown parameter was refused, but the message {str(exc)!r} does not name it")
    except Exception as exc:  # noqa: BLE001
        fail_check(f"an unknown parameter raised {type(exc).__name__} ({exc}), expected ParameterError")
    else:
        fail_check("build(no_such_parameter=1) was accepted; unknown parameter names must fail")


def check_search_space(cls_or_name: Any) -> None:
    """Declared Optuna ranges lie inside the Param bounds and their endpoints build."""
    cls = resolve_controller(cls_or_name)
    for name, spec in cls.search_space().items():
        tune = tuple(spec.tune)
        numeric = spec.kind in (int, float) and spec.choices is None
        if numeric:
            if len(tune) != 2 or not tune[0] <= tune[1]:
                fail_check(f"{name}: tune={tune!r} must be (low, high) with low ≤ high")
            if spec.log and tune[0] <= 0:
                fail_check(f"{name}: a log-scale range needs low > 0, got {tune!r}")
            values = [spec.kind(v) for v in tune]
        else:
            values = list(tune)
        for v in values:
            try:
                spec.check(cls.display_name(), name, v)
            except ParameterError as exc:
                fail_check(f"{name}: tune value {v!r} is outside the parameter's own range: {exc}")
            make_controller(cls, **{name: v})


def check_get_params_round_trip(cls_or_name: Any) -> None:
    """cls(**c.get_params()) == c, for copies too, and decoding leaves the parameters alone."""
    cls = resolve_controller(cls_or_name)
    c = make_controller(cls)
    p = c.get_params()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clone = cls(**p)
        clone.validate()
    for label, other in (("cls(**get_params())", clone), ("copy.deepcopy", copy.deepcopy(c))):
        if other.get_params() != p:
            fail_check(f"{label} gives {other.get_params()!r}, expected {p!r}")
    run_recorded(c, context_toy(), PROMPTS[:2], DecodeConfig(gen_length=G))
    if c.get_params() != p:
        fail_check(f"decoding changed the parameters from {p!r} to {c.get_params()!r}; keep run state in "
              f"state.memory, not in parameters")


def check_save_load_round_trip(cls_or_name: Any) -> None:
    """save_controller -> load_controller gives an equal controller that decodes identically."""
    import yaml

    from adaptive_decoding.framework.engine.controller_io import (
        load_controller,
        load_decode_config,
        save_controller,
    )

    cls = resolve_controller(cls_or_name)
    c = make_controller(cls)
    config = DecodeConfig(gen_length=G, block_length=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "controller.yaml"
        try:
            save_controller(c, path, decode_config=config, extra={"by": "conformance"})
        except Exception as exc:  # noqa: BLE001
            fail_check(f"save_controller raised {type(exc).__name__}: {exc}")
        doc = yaml.safe_load(path.read_text())
        if doc.get("controller") != c.display_name():
            fail_check(f"saved controller name {doc.get('controller')!r}, expected {c.display_name()!r}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = load_controller(path)
        except Exception as exc:  # noqa: BLE001
            fail_check(f"load_controller refused the file it just saved: {type(exc).__name__}: {exc}\n{path.read_text()}")
        if type(loaded) is not type(c) or loaded.get_params() != c.get_params():
            fail_check(f"loaded {type(loaded).__name__}({loaded.get_params()!r}), saved {cls.__name__}({c.get_params()!r})")
        if load_decode_config(path) != config.get_params():
            fail_check(f"load_decode_config gives {load_decode_config(path)!r}, saved {config.get_params()!r}")
    model = context_toy()
    a, _ = run_recorded(c, model, PROMPTS, config, SEEDS)
    b, _ = run_recorded(loaded, model, PROMPTS, config, SEEDS)
    if not torch.equal(a.generated, b.generated) or not torch.equal(a.nfe, b.nfe):
        fail_check(f"the loaded controller decodes differently: {b.generated.tolist()} vs {a.generated.tolist()}")


# ---------------------------------------------------------------------- behaviour checks
def check_decision_fields(cls_or_name: Any) -> None:
    """Decision fields have the documented shapes, dtypes and ranges; memory is per sample."""
    cls = resolve_controller(cls_or_name)
    for config in harness_configs() + harness_configs(block_length=4):
        _, spy = run_recorded(make_controller(cls), context_toy(), PROMPTS, config, SEEDS)
        if spy.problems["fields"]:
            fail_check(f"with {config!r}: " + "; ".join(spy.problems["fields"]))


def check_batch_invariance(cls_or_name: Any, block_length: Optional[int] = None) -> None:
    """A batch of N ragged, different prompts decodes exactly like N single runs."""
    cls = resolve_controller(cls_or_name)
    model = context_toy()
    for config in harness_configs(block_length):
        batch, _ = run_recorded(make_controller(cls), model, PROMPTS, config, SEEDS)
        for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):
            single, _ = run_recorded(make_controller(cls), model, [prompt], config, [seed])
            if not same_row(batch, i, single, 0):
                fail_check(f"with {config!r}, prompt {list(prompt)} (seed {seed}) decoded alone gives "
                      f"{describe_row(single, 0)}, but as row {i} of a batch of {len(PROMPTS)} gives {describe_row(batch, i)}; "
                      f"a row's decisions must depend only on its own features and state.memory rows")


def check_determinism(cls_or_name: Any) -> None:
    """Same seed, same decisions; stochastic controllers differ across seeds, others do not."""
    cls = resolve_controller(cls_or_name)
    model = context_toy()
    for config in harness_configs():
        reused = make_controller(cls)
        runs = [run_recorded(ctrl, model, PROMPTS, config, SEEDS) for ctrl in (reused, reused, make_controller(cls))]
        (r0, s0) = runs[0]
        for label, (r, s) in zip(("the same instance again", "a fresh instance"), runs[1:]):
            same_steps = len(s.steps) == len(s0.steps) and all(
                torch.equal(x["commit"], y["commit"]) for x, y in zip(s.steps, s0.steps))
            if not (torch.equal(r.generated, r0.generated) and torch.equal(r.nfe, r0.nfe) and same_steps):
                fail_check(f"with {config!r} and the same seeds, {label} decided differently: "
                      f"{r.generated.tolist()} (nfe {r.nfe.tolist()}) vs {r0.generated.tolist()} "
                      f"(nfe {r0.nfe.tolist()}); draw randomness from state.seeds (adaptive_decoding.framework.core.rng) and reset "
                      f"all run state in reset()")
    c = make_controller(cls)
    stochastic = bool(getattr(c, "stochastic", False))
    config = DecodeConfig(gen_length=G)
    traces = []
    for seed in range(6):
        r, s = run_recorded(c, model, [PROMPTS[2]], config, [seed])
        traces.append((tuple(r.generated[0].tolist()), tuple(tuple(x["commit"][0].tolist()) for x in s.steps)))
    distinct = len(set(traces))
    if stochastic and distinct == 1:
        fail_check("declares stochastic=True, but 6 different seeds gave identical decisions at temperature 0")
    if not stochastic and distinct > 1:
        fail_check(f"does not declare stochastic=True, but at temperature 0 its decisions depend on the seed "
              f"({distinct} different traces over 6 seeds); set `stochastic = True` if that is intended")


def check_progress(cls_or_name: Any) -> None:
    """≥ 1 commit per row with eligible positions every step, so the loop never forces one."""
    cls = resolve_controller(cls_or_name)
    cases = [("context toy", context_toy(), [list(p) for p in PROMPTS])] + flat_toys()
    for label, model, prompts in cases:
        for config in harness_configs():
            result, spy = run_recorded(make_controller(cls), model, prompts, config, SEEDS[: len(prompts)])
            if spy.problems["progress"] or int(result.forced.sum()):
                fail_check(f"on the {label} with {config!r}: forced={result.forced.tolist()}; "
                      + "; ".join(spy.problems["progress"]))
            if (result.generated == model.mask_token_id).any():
                fail_check(f"on the {label}, decoding ended with masked positions left: {result.generated.tolist()}")


def check_decided_positions(cls_or_name: Any, block_length: Optional[int] = None) -> None:
    """Commits ⊆ eligible; prompt tokens and committed tokens never change."""
    cls = resolve_controller(cls_or_name)
    for config in harness_configs(block_length):
        _, spy = run_recorded(make_controller(cls), context_toy(), PROMPTS, config, SEEDS)
        if spy.problems["subset"]:
            fail_check(f"with {config!r}: " + "; ".join(spy.problems["subset"]))
        for prompt, seed in zip(PROMPTS, SEEDS):
            rec = Recorder(context_toy())
            result, _ = run_recorded(make_controller(cls), rec, [prompt], config, [seed])
            frames = [c for c in rec.canvases if c.shape[0] == 1] + [result.tokens]  # not batched probes
            n = len(prompt)
            revocable = bool(getattr(make_controller(cls), "revocable", False))
            editing = bool(getattr(make_controller(cls), "edits", False))
            for t, (before, after) in enumerate(zip(frames, frames[1:])):
                decided = before != rec.mask_token_id
                if revocable:  # re-masking is allowed; a token never turns into another one directly
                    decided &= after != rec.mask_token_id
                if editing:  # token-to-token editing may rewrite decided generated tokens, never the prompt
                    decided[:, n:] = False
                if not torch.equal(before[decided], after[decided]) or before[0, :n].tolist() != list(prompt):
                    fail_check(f"prompt {list(prompt)}: a decided token changed between forward {t} and {t + 1}: "
                          f"{before[0].tolist()} -> {after[0].tolist()}")


def check_semi_ar_blocks(cls_or_name: Any) -> None:
    """Inside semi-AR blocks: progress, commits ⊆ eligible and batch invariance still hold."""
    cls = resolve_controller(cls_or_name)
    for block_length in (4, 2):
        for config in harness_configs(block_length):
            result, spy = run_recorded(make_controller(cls), context_toy(), PROMPTS, config, SEEDS)
            problems = spy.problems["subset"] + spy.problems["progress"]
            if problems or int(result.forced.sum()):
                fail_check(f"with {config!r}: forced={result.forced.tolist()}; " + "; ".join(problems))
    check_batch_invariance(cls, block_length=2)


def check_revocable_bounds(cls_or_name: Any) -> None:
    """Re-masks stay within the loop's bounds and decoding still finishes; others re-mask nothing."""
    cls = resolve_controller(cls_or_name)
    revocable = bool(getattr(make_controller(cls), "revocable", False))
    configs = harness_configs() + harness_configs(block_length=4) if revocable else harness_configs(caches=("none",))[:1]
    for base in configs:
        config = DecodeConfig(**{**base.get_params(), "remask_budget": 2, "remask_per_position": 1})
        result, spy = run_recorded(make_controller(cls), context_toy(), PROMPTS, config, SEEDS)
        if spy.problems["subset"] or spy.problems["fields"]:
            fail_check(f"with {config!r}: " + "; ".join(spy.problems["subset"] + spy.problems["fields"]))
        remasks = result.remasks if result.remasks is not None else torch.zeros_like(result.nfe)
        if not revocable and int(remasks.sum()):
            fail_check(f"re-masked {remasks.tolist()} tokens without declaring revocable = True")
        if (remasks > 2).any() or (result.steps > G + 2).any():
            fail_check(f"with remask_budget=2: remasks {remasks.tolist()}, steps {result.steps.tolist()} "
                  f"(at most 2 and {G + 2})")
        if (result.generated == context_toy().mask_token_id).any():
            fail_check(f"with {config!r}, decoding ended with masked positions left: {result.generated.tolist()}")


def _shadow_model() -> Any:
    """A 2-layer tiny transformer (random weights) with WINO's shadow block and a real KV cache; its head
    is scaled so predictions are peaked: several drafts a step, some of which fail verification (WINO
    re-masks under greedy decoding with every cache mode)."""
    from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser

    torch.manual_seed(0)
    cfg = TinyConfig(vocab_size=16, mask_token_id=15, pad_token_id=0, eos_token_id=14, max_len=24, d_model=16,
                     n_layers=2, n_heads=2, d_ff=32)
    model = TinyDenoiser(cfg).eval()
    with torch.no_grad():
        model.head.weight.mul_(60.0)
    return model


def check_shadow_verification(cls_or_name: Any) -> None:
    """A controller that ``verifies`` gets the shadow block on a real transformer under every cache mode:
    no extra forward, a ragged batch equals single runs, decoding finishes (others: nothing to check)."""
    cls = resolve_controller(cls_or_name)
    if not bool(getattr(make_controller(cls), "verifies", False)):
        return
    model = _shadow_model()
    for config in harness_configs(block_length=4):
        batch, spy = run_recorded(make_controller(cls), model, PROMPTS, config, SEEDS)
        problems = spy.problems["subset"] + spy.problems["fields"]
        if problems:
            fail_check(f"with {config!r} on a tiny transformer: " + "; ".join(problems))
        if not torch.equal(batch.nfe, batch.steps):
            fail_check(f"with {config!r}: NFE {batch.nfe.tolist()} but steps {batch.steps.tolist()}; the shadow block "
                  f"rides in each step's forward, so a verifying controller costs one forward a step")
        if (batch.generated == model.mask_token_id).any():
            fail_check(f"with {config!r}, decoding ended with masked positions left: {batch.generated.tolist()}")
        for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):
            single, _ = run_recorded(make_controller(cls), model, [prompt], config, [seed])
            if not same_row(batch, i, single, 0):
                fail_check(f"with {config!r} on a tiny transformer, prompt {list(prompt)} alone gives {describe_row(single, 0)}, "
                      f"as row {i} of a batch {describe_row(batch, i)}")


def check_block_causal_canvas(cls_or_name: Any) -> None:
    """On a block-causal canvas: batch invariance, progress, and ``cache='block'`` equal to ``'none'``."""
    from adaptive_decoding.framework.testing.toys import BlockCausalToy

    cls = resolve_controller(cls_or_name)
    model = BlockCausalToy(context_toy(), block_size=3)
    for temperature in (0.0, 0.8):
        runs = {}
        for cache in ("none", "block"):
            config = DecodeConfig(gen_length=G, cache=cache, temperature=temperature)
            batch, spy = run_recorded(make_controller(cls), model, PROMPTS, config, SEEDS)
            if spy.problems["progress"] or int(batch.forced.sum()) or (batch.generated == model.mask_token_id).any():
                fail_check(f"on a block-causal canvas with {config!r}: forced={batch.forced.tolist()}, output "
                           f"{batch.generated.tolist()}; " + "; ".join(spy.problems["progress"]))
            for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):
                single, _ = run_recorded(make_controller(cls), model, [prompt], config, [seed])
                if not same_row(batch, i, single, 0):
                    fail_check(f"on a block-causal canvas with {config!r}, prompt {list(prompt)} alone gives "
                               f"{describe_row(single, 0)} but {describe_row(batch, i)} as row {i} of a batch")
            runs[cache] = batch
        if not (torch.equal(runs["none"].generated, runs["block"].generated)
                and torch.equal(runs["none"].nfe, runs["block"].nfe)):
            fail_check(f"on a block-causal canvas at temperature {temperature}, cache='block' decodes "
                       f"{runs['block'].generated.tolist()} (nfe {runs['block'].nfe.tolist()}) but cache='none' "
                       f"{runs['none'].generated.tolist()} (nfe {runs['none'].nfe.tolist()}); the cache of "
                       f"completed blocks is exact")


def check_multi_block_window(cls_or_name: Any) -> None:
    """With several blocks active (multi-block decoding) under every cache mode: progress, commits ⊆
    eligible, nothing left masked, batch invariance."""
    cls = resolve_controller(cls_or_name)
    model = context_toy()
    for base in harness_configs(block_length=2):
        config = DecodeConfig(**{**base.get_params(), "block_add_threshold": 0.5})
        batch, spy = run_recorded(make_controller(cls), model, PROMPTS, config, SEEDS)
        problems = spy.problems["subset"] + spy.problems["progress"] + spy.problems["fields"]
        if problems or int(batch.forced.sum()) or (batch.generated == model.mask_token_id).any():
            fail_check(f"with several active blocks, {config!r}: forced={batch.forced.tolist()}, output "
                       f"{batch.generated.tolist()}; " + "; ".join(problems))
        for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):
            single, _ = run_recorded(make_controller(cls), model, [prompt], config, [seed])
            if not same_row(batch, i, single, 0):
                fail_check(f"with several active blocks, {config!r}, prompt {list(prompt)} alone gives "
                           f"{describe_row(single, 0)} but {describe_row(batch, i)} as row {i} of a batch")


CHECKS: tuple[tuple[str, Check], ...] = (
    ("implements", check_implements),
    ("params_declared", check_params_declared),
    ("param_validation", check_param_validation),
    ("search_space", check_search_space),
    ("get_params_round_trip", check_get_params_round_trip),
    ("save_load_round_trip", check_save_load_round_trip),
    ("decision_fields", check_decision_fields),
    ("batch_invariance", check_batch_invariance),
    ("determinism", check_determinism),
    ("progress", check_progress),
    ("decided_positions", check_decided_positions),
    ("semi_ar_blocks", check_semi_ar_blocks),
    ("revocable_bounds", check_revocable_bounds),
    ("block_causal_canvas", check_block_causal_canvas),
    ("multi_block_window", check_multi_block_window),
    ("shadow_verification", check_shadow_verification),
)


def controller_checks() -> Iterator[tuple[str, Check]]:
    """``(check_name, check_fn)`` pairs; ``check_fn(cls_or_name)`` raises :class:`ConformanceError`."""
    yield from CHECKS


def expected_failures(cls_or_name: Any) -> dict[str, str]:
    """The class's ``conformance_expected_failures`` (check name -> reason), validated."""
    cls = resolve_controller(cls_or_name)
    out = dict(getattr(cls, "conformance_expected_failures", {}) or {})
    unknown = [k for k in out if k not in dict(CHECKS)]
    if unknown:
        raise ValueError(f"{cls.__name__}.conformance_expected_failures names unknown check {unknown[0]!r}; "
                         f"known: {', '.join(n for n, _ in CHECKS)}")
    return out


def check_controller(cls_or_name: Any, *, checks: Optional[Sequence[str]] = None,
                     expected_failed_checks: Optional[dict[str, str]] = None) -> None:
    """Run the conformance checks on a controller; raise one :class:`ConformanceError` listing all
    unexpected failures. Expected failures (the class's ``conformance_expected_failures`` plus
    ``expected_failed_checks``) only warn, and warn too when they unexpectedly pass."""
    cls = resolve_controller(cls_or_name)
    expected = {**expected_failures(cls), **(expected_failed_checks or {})}
    table = dict(CHECKS)
    selected = list(checks) if checks is not None else [n for n, _ in CHECKS]
    for name in selected:
        if name not in table:
            raise ValueError(f"unknown conformance check {name!r}; known: {', '.join(table)}")
    failures = []
    for name in selected:
        try:
            table[name](cls)
        except ConformanceError as exc:
            if name in expected:
                warnings.warn(f"{cls.display_name()}: expected failure of {name} ({expected[name]}): {exc}")
            else:
                failures.append(f"  - {name}: {exc}")
        else:
            if name in expected:
                warnings.warn(f"{cls.display_name()}: {name} is listed as an expected failure "
                              f"({expected[name]}) but passes; remove it from the list")
    if failures:
        raise ConformanceError(f"controller {cls.display_name()!r} ({cls.__module__}.{cls.__qualname__}) failed "
                               f"{len(failures)} of {len(selected)} conformance checks:\n" + "\n".join(failures))
