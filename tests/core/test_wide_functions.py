"""No public function takes more than :data:`MAX_PARAMETERS` parameters unless a reason is written.

A wide entry point takes a few options objects grouped by concern (:mod:`adaptive_decoding.framework.core.options`)
instead of dozens of keywords. Counted on the code itself (AST) over the packages, tests excluded:
every parameter but ``self``/``cls``, ``*args`` and ``**kwargs`` one each. A function is public when
neither its name nor an enclosing class's starts with ``_`` (``__init__`` of a public class is public).

Exempt by rule, not listed: the constructor of a :class:`~adaptive_decoding.framework.core.params.Configurable` whose
every keyword is a declared ``Param`` of the class's ``params`` (a controller, a scorer, a task,
``DecodeConfig``): its keywords *are* its validated, round-tripping options, the scikit-learn
convention of docs/DESIGN, addressed flat by ``--set`` / ``--task-param`` and recorded flat in results
files' settings hashes.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "controllers", "scorers", "experiments")
MAX_PARAMETERS = 8

#: public functions allowed more than MAX_PARAMETERS parameters, each with its reason
ALLOWED: dict[str, str] = {
    "framework/integrations/diffusers_scheduler.py:FrameworkScheduler.step":
        "diffusers' scheduler contract: LLaDA2Pipeline calls step() with these keywords",
    "framework/engine/lookahead/facade.py:Lookahead.refine":
        "next: the loop's per-step call, all per-step data (the sub-batch's canvas, attention, features, decision, "
        "commit, tokens, state and budget, the model and the controller), no settings; to be grouped with the "
        "step's Window",
    "framework/engine/loop.py:decode":
        "the public decode(model, prompts, controller, config, *, seeds, lookahead, trace, context, initial) that "
        "plugins, docs and tests call by keyword: its settings are already one options object (DecodeConfig), the "
        "five keywords are per-call inputs (start_run takes them as one CallInputs)",
    "framework/engine/evaluate.py:evaluate":
        "next: split, n, batch_size and data_seed are an ExampleDraw (framework/tasks/options.py); its callers in "
        "experiments, tuning, bench, the policy pipeline and tests pass them by keyword, to be moved together",
    "framework/models/arch/layers.py:MaskedDiffusionLM.forward":
        "a model forward: the tensors and cache handles of one call (Hugging Face's forward convention)",
    "framework/models/arch/layers.py:Block.forward_chunked":
        "a model forward over query chunks: tensors and cache handles of one call",
    "framework/models/arch/layers.py:Block.__init__":
        "an nn.Module's architecture hyper-parameters (d_model, heads, ...), read from checkpoint configs",
    "framework/models/arch/layers.py:SelfAttention.forward":
        "a model forward: tensors and cache handles of one call",
    "framework/models/arch/llada2.py:LLaDA2MoeModel.forward":
        "Hugging Face's forward signature of the published LLaDA2 model, kept so its weights and calls load",
    "framework/models/arch/dream.py:dream_window_logits":
        "a model forward over the loop's window: tensors and cache handles of one call",
    "framework/models/arch/variants.py:HeadAttention.__init__":
        "an nn.Module's architecture hyper-parameters, read from checkpoint configs",
    "framework/models/tiny.py:TinyDenoiser.core":
        "a model forward: tensors and cache handles of one call",
    "framework/training/masked_diffusion.py:MaskedDiffusionLM.__init__":
        "a LightningModule: its keywords are save_hyperparameters()'s checkpointed hparams (Lightning's "
        "convention; a checkpoint reloads them by name)",
    "framework/training/causal_lm.py:CausalLMModule.__init__":
        "a LightningModule: its keywords are save_hyperparameters()'s checkpointed hparams",
    "framework/tuning/objective.py:run_worker":
        "the module-level target of spawned tuning processes: its arguments are pickled positionally to each "
        "worker (TuneSettings already groups the study's setup)",
}


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _configurable_init(cls: ast.ClassDef, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``fn`` is ``cls.__init__`` and every keyword of it is a key of ``cls``'s ``params = {...}``."""
    if fn.name != "__init__":
        return False
    for node in cls.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "params" for t in targets) and isinstance(node.value, ast.Dict):
            keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            args = [x.arg for x in (*fn.args.args, *fn.args.kwonlyargs) if x.arg != "self"]
            return bool(args) and set(args) <= keys
    return False


def wide_functions(source: str, where: str, limit: int = MAX_PARAMETERS) -> list[tuple[str, int, bool]]:
    """``(where:qualified name, parameters, public)`` of every function in ``source`` over ``limit``
    parameters, except a Configurable's constructor (the module docstring)."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, prefix: str, public: bool, cls: ast.ClassDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pub = public and (not child.name.startswith("_") or child.name == "__init__")
                if _count(child) > limit and not (cls is not None and _configurable_init(cls, child)):
                    found.append((f"{where}:{prefix}{child.name}", _count(child), pub))
                visit(child, f"{prefix}{child.name}.", False, None)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", public and not child.name.startswith("_"), child)
            else:
                visit(child, prefix, public, cls)

    visit(ast.parse(source), "", True, None)
    return found


def all_wide_functions() -> list[tuple[str, int, bool]]:
    return [row for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
            for row in wide_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]


def test_no_public_function_takes_more_than_eight_parameters_without_a_reason():
    wide = [f"{name} ({n} parameters)" for name, n, public in all_wide_functions()
            if public and name not in ALLOWED]
    assert wide == [], "group these keywords into options objects (framework/core/options.py), or write the " \
                       "reason in ALLOWED"


def test_every_allowed_function_is_still_wide():
    """An entry of the allow-list whose function was narrowed (or removed) is taken out of it."""
    wide = {name for name, _, _ in all_wide_functions()}
    assert sorted(set(ALLOWED) - wide) == []


def test_the_counter_counts_every_parameter_and_exempts_a_configurables_constructor():
    source = (
        "def f(a, b, *c, d, **e): pass\n"
        "class P:\n"
        "    params = {'x': 1, 'y': 2}\n"
        "    def __init__(self, x, y): pass\n"
        "    def m(self, a, b, c): pass\n"
        "class _Q:\n"
        "    def __init__(self, a, b, c): pass\n"
        "class R:\n"
        "    params = {'x': 1}\n"
        "    def __init__(self, x, z): pass\n"
    )
    assert wide_functions(source, "m", limit=2) == [("m:f", 5, True), ("m:P.m", 3, True),
                                                    ("m:_Q.__init__", 3, False)]
    rows = wide_functions(source, "m", limit=1)
    assert ("m:f", 5, True) in rows and ("m:P.m", 3, True) in rows and ("m:_Q.__init__", 3, False) in rows
    assert ("m:R.__init__", 2, True) in rows  # z is not a declared parameter: not exempt
    assert not any(name == "m:P.__init__" for name, _, _ in rows)  # every keyword declared: exempt
