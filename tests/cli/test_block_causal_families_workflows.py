"""Every workflow on tiny SDAR, Fast-dLLM v2 and LLaDA-MoE checkpoints in their real on-disk formats
(``tests/fixtures/real_format/families.py``), loaded by ``--model DIR``: ``adec decode``, ``generate``,
``bench``, ``run`` (+ ``report``), ``tune``, ``train-controller`` and ``adec lm-eval``, each
parametrised over the three families (the LLaDA2 checkpoint's are in test_block_causal_workflows.py,
which this file follows).

Each checkpoint's final norm is multiplied by 40 on disk, so that its predictions are confident
enough for threshold rules to commit several tokens in one forward; a word-level tokenizer of the
model's whole vocabulary sits beside it (every id decodes to a word). The data files are made to be
partly right: their answers are what one-token-per-step decoding writes, except every fourth row's,
so ``sequential`` scores exactly 3/4 with exactly G forwards in every workflow.

Each family runs its own rule (``sdar``, ``fast_dllm_v2``; LLaDA-MoE, full attention, LLaDA's
``llada``) and its cache: the block-causal two ``cache='block'`` (exact: the same tokens and
forwards as none), LLaDA-MoE Fast-dLLM's ``prefix`` (approximate: the same forwards for fixed-step
rules). The refusals (a cache mode the model has no meaning for, a block length it was not trained
with or that does not divide G) are checked before any forward: the family's network's forward is
patched to fail the test if it runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from adaptive_decoding.framework.cli.main import main

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read when datasets is imported: the jsonl files are local

ROOT = Path(__file__).resolve().parents[2]
G, V, MASK = 8, 320, 310
SCALE = 40.0
LM_TASKS = ROOT / "tests" / "fixtures" / "lm_eval"
#: test_hub's word vocabulary first (the same ids for the same prompts), then a word for every other id
WORDS = ["[PAD]", "[UNK]", "[EOS]", "[MASK]", *[f"w{i}" for i in range(8)], "hello", "world", "user", "assistant",
         *[f"t{i}" for i in range(16, V)]]
QUESTIONS = ["hello", "hello world w1", "user w4 w5", "w2 w3", "world", "w6 w6 w7 assistant", "assistant w0",
             "user hello world w1 w2"]


@dataclass(frozen=True)
class Family:
    """One family's checkpoint and how its workflows run: the config builder and its overrides, the
    family's rule (``name`` and its parameters, the knob ``run`` sweeps, the range ``tune`` searches),
    its cache mode, the task's block length, and two refusals ``(--set values, message, allowed)``."""

    config: str
    overrides: dict
    rule: str
    params: dict
    sweep: dict
    tune_range: str
    cache: str
    block_length: int
    arch: str
    refusals: tuple

    @property
    def exact_cache(self) -> bool:
        return self.cache == "block"

    def rule_label(self) -> str:
        return ":".join([self.rule, ",".join(f"{k}={v}" for k, v in self.params.items())]).rstrip(":")


BLOCK_CAUSAL = "does not apply to a block-causal model"
FAMILIES = {
    "sdar": Family("sdar_config", {"block_size": 4, "mask_token_id": MASK}, "sdar", {"threshold": 0.5},
                   {"threshold": [0.9, 0.5]}, "threshold=0.5:0.9", "block", 4, "SDARModel",
                   ((["cache=dual"], f"cache='dual' {BLOCK_CAUSAL}", "allowed: none, block"),
                    (["block_length=8", "gen_length=16"], "block_length=8 is not the block size",
                     "allowed: 4 (or null for it)"))),
    "fast_dllm_v2": Family("fast_dllm_v2_config", {"bd_size": 8, "mask_token_id": MASK}, "fast_dllm_v2",
                           {"threshold": 0.5}, {"threshold": [0.9, 0.5]}, "threshold=0.5:0.9", "block", 8,
                           "FastDLLMv2Model",
                           ((["cache=prefix"], f"cache='prefix' {BLOCK_CAUSAL}", "allowed: none, block"),
                            (["block_length=4"], "block_length=4 is not the block size",
                             "allowed: 8 (or null for it)"))),
    "lladamoe": Family("llada_moe_config", {}, "llada", {"steps": 4}, {"steps": [8, 4]}, "steps=2:8", "prefix", 8,
                       "LLaDAMoEModel",
                       ((["cache=block"], "cache='block' does not apply to a full model", "allowed: none, prefix, dual"),
                        (["block_length=3", "gen_length=8"], "block_length=3 does not divide gen_length=8",
                         "allowed: a divisor of 8"))),
}


def _module(path: Path, name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _tokenizer(folder: Path) -> None:
    """A word-level fast tokenizer over :data:`WORDS` (one word per id of the model), saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]",
                            mask_token="[MASK]").save_pretrained(folder)


def _sharpen(folder: Path, scale: float = SCALE) -> None:
    """Multiply ``model.norm.weight`` by ``scale`` in the shard that holds it (the index names it)."""
    from safetensors.torch import load_file, save_file

    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
    tensors = load_file(shard)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * scale
    save_file(tensors, shard, metadata={"format": "pt"})


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """One family's folder (sharpened, with its tokenizer), its loaded model, train (8) / validation (4) /
    test (4) JSONL files whose answers are one-token-per-step decodes (every fourth one wrong), the data
    task's parameters and their ``--task-param`` flags."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts
    from adaptive_decoding.framework.models.zoo import load_model

    name, spec = request.param, FAMILIES[request.param]
    fam = _module(ROOT / "tests" / "fixtures" / "real_format" / "families.py", "_adec_real_format_families")
    tmp = tmp_path_factory.mktemp(name)
    folder = fam.build(tmp / "ckpt", getattr(fam, spec.config)(**spec.overrides), seed=2)
    _sharpen(folder)
    _tokenizer(folder)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    assert loaded.info["kind"] == name
    texts, _, _ = decode_texts(loaded, QUESTIONS, build_controller("sequential"),
                               DecodeConfig(gen_length=G, block_length=spec.block_length))
    rows = [{"question": q, "answer": t if i % 4 != 3 else "no such answer"}
            for i, (q, t) in enumerate(zip(QUESTIONS, texts))]
    files = {"train": _write(tmp / "train.jsonl", rows), "validation": _write(tmp / "validation.jsonl", rows[:4]),
             "test": _write(tmp / "test.jsonl", rows[4:])}
    params = dict(**{split: str(path) for split, path in files.items()}, template="{question}", answer="answer",
                  metric="exact", gen_length=G, block_length=spec.block_length)
    return {"name": name, "spec": spec, "folder": str(folder), "loaded": loaded, "params": params,
            "args": [f"--task-param={k}={v}" for k, v in params.items()]}


def _task(fx):
    from adaptive_decoding.framework.tasks.base import get_task

    return get_task("data", **fx["params"])


def _evaluate(fx, ctrl, **cfg):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.evaluate import evaluate

    return evaluate(fx["loaded"], _task(fx), ctrl, DecodeConfig(gen_length=G, block_length=fx["spec"].block_length,
                                                                **cfg), n=4)


@pytest.fixture
def no_forward(family, monkeypatch):
    """Any forward of the family's network fails the test: what must fail before any work does."""
    from adaptive_decoding.framework.models import arch

    def boom(self, *a, **k):
        raise AssertionError("the model ran a forward")

    monkeypatch.setattr(getattr(arch, family["spec"].arch), "forward", boom)


def _sets(params: dict) -> list[str]:
    return [a for k, v in params.items() for a in ("--set", f"{k}={v}")]


def _decode(capsys, fx, cache: str, prompts: list[str]) -> list[dict]:
    spec = fx["spec"]
    argv = ["decode", "--model", fx["folder"], "--device", "cpu", "--controller", spec.rule, "--set", f"gen_length={G}",
            "--set", f"cache={cache}", "--json", *[a for p in prompts for a in ("--prompt", p)], *_sets(spec.params)]
    assert main(argv) == 0, capsys.readouterr().err
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# ----------------------------------------------------------------------------------- decode, generate
def test_decode_by_folder_with_the_familys_rule_and_its_cache(family, capsys):
    prompts = ["hello", "hello world w1 w2 w3", "user w4 w5"]
    a, b = _decode(capsys, family, "none", prompts), _decode(capsys, family, family["spec"].cache, prompts)
    if family["spec"].exact_cache:  # the exact cache of completed blocks: the same tokens
        assert [r["generated_ids"] for r in a] == [r["generated_ids"] for r in b]
    assert [r["nfe"] for r in a] == [r["nfe"] for r in b]
    assert all(len(r["generated_ids"]) == G and MASK not in r["generated_ids"] for r in a)
    assert all(1 <= r["nfe"] <= G for r in a) and min(r["nfe"] for r in a) < G  # several tokens a forward


def test_generate_by_folder_writes_the_decoded_rows(family, capsys, tmp_path):
    spec = family["spec"]
    prompts = ["hello", "user w4 w5"]
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    _write(inp, [{"id": f"p{i}", "prompt": p} for i, p in enumerate(prompts)])
    argv = ["generate", "--input", str(inp), "--output", str(out), "--model", family["folder"], "--device", "cpu",
            "--controller", spec.rule, "--set", f"gen_length={G}", "--set", f"cache={spec.cache}", "--no-progress",
            *_sets(spec.params)]
    assert main(argv) == 0, capsys.readouterr().err
    rows = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    want = _decode(capsys, family, spec.cache, prompts)
    assert [(r["id"], r["status"]) for r in rows] == [("p0", "ok"), ("p1", "ok")]
    assert [r["generated_ids"] for r in rows] == [w["generated_ids"] for w in want]
    assert [r["nfe"] for r in rows] == [w["nfe"] for w in want]


@pytest.mark.parametrize("which", [0, 1])
def test_decode_and_generate_refuse_what_the_model_has_no_meaning_for_before_any_forward(family, no_forward,
                                                                                         capsys, tmp_path, which):
    spec = family["spec"]
    sets, named, allowed = spec.refusals[which]
    argv = ["decode", "--model", family["folder"], "--device", "cpu", "--controller", spec.rule, "--prompt", "hi",
            *[a for s in sets for a in ("--set", s)], "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and any(line.startswith("adec decode: error: ") for line in err.splitlines())
    assert named in err and allowed in err
    inp, res = _write(tmp_path / "prompts.jsonl", [{"prompt": "hi", "id": "p0"}]), tmp_path / "results.jsonl"
    assert main(["generate", "--input", str(inp), "--output", str(res), "--model", family["folder"], "--device",
                 "cpu", "--controller", spec.rule, *[a for s in sets for a in ("--set", s)], "--no-progress",
                 "--max-retries", "0"]) == 2
    assert allowed in capsys.readouterr().err and not res.exists()


# ------------------------------------------------------------------------------------------ adec bench
def test_bench_on_the_data_task_scores_and_caches(family, tmp_path):
    """Three controllers over the data task: the one-token-per-step row scores exactly 3/4 in G
    forwards, the family's rule fewer; the rule's row is the engine's; the family's cache changes
    nothing where it is exact (block-causal) and no forward count of a fixed-step rule (LLaDA-MoE)."""
    from adaptive_decoding.framework.engine.controller_io import build_controller

    spec, rule = family["spec"], family["spec"].rule_label()
    rows = {}
    for cache in ("none", spec.cache):
        out = tmp_path / f"bench-{cache}.json"
        assert main(["bench", "--task", "data", "--model", family["folder"], "--device", "cpu", *family["args"],
                     "--controller", "sequential", "--controller", rule, "--controller", "fast_dllm:threshold=0.5",
                     "--n", "4", "--set", f"cache={cache}", "--json", str(out), "--no-plot"]) == 0
        rows[cache] = {r["strategy"]: r for r in json.loads(out.read_text())}
    none, cached = rows["none"], rows[spec.cache]
    assert list(none) == ["sequential", rule, "fast_dllm:threshold=0.5"]
    assert all(r["n"] == 4 for r in none.values())
    assert none["sequential"]["accuracy"] == 0.75 and none["sequential"]["nfe"] == float(G)
    assert none[rule]["nfe"] < G and none[rule]["tpf"] > 1.0
    same = list(none) if spec.exact_cache else ["sequential", rule]
    for label in same:
        assert cached[label]["nfe"] == none[label]["nfe"]
        if spec.exact_cache:
            assert cached[label]["accuracy"] == none[label]["accuracy"]
    want = _evaluate(family, build_controller(spec.rule, **spec.params))
    assert (none[rule]["accuracy"], none[rule]["nfe"]) == (want.accuracy, want.nfe)


@pytest.mark.parametrize("command", ["bench", "run", "tune", "train-controller"])
def test_task_workflows_refuse_a_block_length_before_any_forward(family, no_forward, tmp_path, capsys, command):
    """A task block length the model refuses (not its trained block; for LLaDA-MoE, not a divisor of
    G) fails each task workflow with the message that names it, before the model runs once."""
    spec = family["spec"]
    bad = int(spec.refusals[1][0][0].split("=")[1])
    named, allowed = spec.refusals[1][1:]
    params = {**family["params"], "block_length": bad}
    if command == "run":
        exp = tmp_path / "bad.yaml"
        exp.write_text(yaml.safe_dump({"name": "bad", "model": family["folder"], "device": "cpu", "n": 2,
                                       "seeds": [0], "tasks": [{"name": "data", "params": params}],
                                       "strategies": [{"controller": spec.rule}]}))
        argv = ["run", str(exp), "--out", str(tmp_path / "runs"), "--wandb", "disabled", "--no-progress"]
    else:
        argv = [command, "--task", "data", "--model", family["folder"], "--device", "cpu",
                *[f"--task-param={k}={v}" for k, v in params.items()], "--out", str(tmp_path / "out")]
        argv += {"bench": ["--controller", spec.rule, "--n", "2", "--no-plot"],
                 "tune": ["--controller", spec.rule, "--n-trials", "2", "--n-val", "2", "--n-test", "2", "--no-plot"],
                 "train-controller": ["--policy", "logreg", "--n-train", "4", "--n-val", "2", "--n-test", "2",
                                      "--wandb", "disabled"]}[command]
        if command == "bench":
            argv[argv.index("--out"):argv.index("--out") + 2] = ["--json", str(tmp_path / "out.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"adec {command}: error: " in err and named in err and allowed in err


# -------------------------------------------------------------------------------- adec run, adec report
def test_run_sweeps_the_familys_rule_and_reports_its_aup(family, tmp_path):
    """``adec run``: one token per step, the family's rule swept over its knob, and the rule with the
    family's cache; then ``adec report``: a curve and an AUP per strategy."""
    from adaptive_decoding.framework.engine.controller_io import build_controller

    spec = family["spec"]
    (knob, values), = spec.sweep.items()
    exp = tmp_path / "family.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "family", "model": {"name": family["folder"], "dtype": "float32"}, "device": "cpu", "n": 4,
        "batch_size": 4, "seeds": [0], "tasks": [{"name": "data", "label": "mydata", "params": family["params"]}],
        "strategies": [{"label": "sequential", "controller": "sequential"},
                       {"label": "rule", "controller": spec.rule, "sweep": {knob: values}},
                       {"label": "rule cached", "controller": spec.rule, "params": {knob: values[-1]},
                        "decode": {"cache": spec.cache}}],
    }))
    runs = tmp_path / "runs"
    assert main(["run", str(exp), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    rows = {r["strategy"]: r for r in json.loads((runs / "family" / "summary.json").read_text())}
    swept = [f"rule ({knob}={v})" for v in values]
    assert set(rows) == {"sequential", *swept, "rule cached"}
    assert all(r["n"] == 4 and r["task"] == "mydata" for r in rows.values())
    assert rows["sequential"]["accuracy"] == 0.75 and rows["sequential"]["nfe"] == float(G)
    fast, cached = rows[swept[-1]], rows["rule cached"]
    assert cached["decode"] == {"cache": spec.cache} and fast["nfe"] < G
    assert cached["nfe"] == fast["nfe"] and (cached["accuracy"] == fast["accuracy"] or not spec.exact_cache)
    assert rows[swept[0]]["nfe"] >= fast["nfe"]
    want = _evaluate(family, build_controller(spec.rule, **{knob: values[-1]}))
    assert (fast["accuracy"], fast["nfe"]) == (want.accuracy, want.nfe)
    assert main(["report", "--runs", str(runs / "family"), "--out", str(tmp_path / "docs")]) == 0
    report = json.loads((tmp_path / "docs" / "benchmark.json").read_text())["tasks"]["mydata"]
    assert set(report["aup"]) == {"sequential", "rule", "rule cached"} and all(v >= 0 for v in report["aup"].values())
    assert report["curves"]["rule"] == swept
    assert report["aup"]["sequential"] == pytest.approx(75.0)  # one point: accuracy % · 1 token per forward


# ------------------------------------------------------------------------------------------- adec tune
def test_tune_exports_a_point_inside_the_range_that_decodes(family, tmp_path):
    from adaptive_decoding.framework.engine.controller_io import build_controller

    spec = family["spec"]
    knob, _, span = spec.tune_range.partition("=")
    low, high = (float(v) for v in span.split(":"))
    out = tmp_path / "tune"
    assert main(["tune", "--controller", spec.rule, "--task", "data", "--model", family["folder"], "--device", "cpu",
                 *family["args"], "--n-trials", "3", "--range", spec.tune_range, "--n-val", "4", "--n-test", "4",
                 "--out", str(out), "--no-plot", "--no-prune"]) == 0
    exported = list(out.glob("*.yaml"))
    assert len(exported) == 1
    point = yaml.safe_load(exported[0].read_text())
    assert point["controller"] == spec.rule and low <= point["params"][knob] <= high
    ctrl = build_controller(f"tuned:{exported[0]}")
    assert ctrl.get_params()[knob] == point["params"][knob]
    res = _evaluate(family, ctrl, cache=spec.cache)
    assert res.n == 4 and 1.0 <= res.nfe <= G


# ------------------------------------------------------------------------------ adec train-controller
def test_train_controller_trains_a_policy_that_decodes_the_family(family, tmp_path):
    from adaptive_decoding.framework.engine.controller_io import build_controller

    spec = family["spec"]
    out = tmp_path / "policy"
    assert main(["train-controller", "--task", "data", "--model", family["folder"], "--device", "cpu",
                 *family["args"], "--policy", "logreg", "--n-train", "4", "--n-val", "2", "--n-test", "2",
                 "--out", str(out), "--wandb", "disabled", "--decode-batch-size", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"]["train_rows"] > 0 and (out / "logreg.pt").exists()
    ctrl = build_controller("logreg", policy=str(out / "logreg.pt"))
    none = _evaluate(family, ctrl)
    cached = _evaluate(family, ctrl, cache=spec.cache)
    assert none.n == cached.n == 4 and 1.0 <= none.nfe <= G and 1.0 <= cached.nfe <= G
    if spec.exact_cache:
        assert (cached.accuracy, cached.nfe) == (none.accuracy, none.nfe)


# ---------------------------------------------------------------------------------------- adec lm-eval
@pytest.fixture
def lm_eval_env(monkeypatch, tmp_path):
    """lm-eval offline over the fixture tasks (their data_files are relative to the repository root)."""
    pytest.importorskip("lm_eval")
    import datasets

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets", raising=False)
    return tmp_path


def test_lm_eval_generate_until_equals_decode_with_either_cache(family, lm_eval_env, monkeypatch, capsys):
    """lm-eval's generate_until through the ``adec`` model on the family's folder (``model=DIR``): each
    answer is ``decode()``'s text cut at the task's ``until``, without and (where the cache is exact)
    with the family's cache, at the same mean forwards; then ``adec lm-eval run`` prints exact_match."""
    import lm_eval
    import lm_eval.tasks

    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts
    from adaptive_decoding.framework.integrations import lm_eval_model  # noqa: F401  (registers lm-eval's "adec" model)

    spec = family["spec"]
    rule_args = ",".join(f"{k}={v}" for k, v in spec.params.items())
    prompts = [json.loads(line)["prompt"] for line in (LM_TASKS / "copy_gen.jsonl").read_text().splitlines()]
    tm = lm_eval.tasks.TaskManager(include_path=str(LM_TASKS), include_defaults=False)
    for cache in ("none", spec.cache):
        texts, results, _ = decode_texts(family["loaded"], prompts, build_controller(spec.rule, **spec.params),
                                         DecodeConfig(gen_length=G, cache=cache))
        nfe = sum(float(r.nfe.float().sum()) for r in results) / len(prompts)
        res = lm_eval.simple_evaluate(
            model="adec", tasks=["adec_copy_gen"], task_manager=tm, log_samples=True, bootstrap_iters=0,
            model_args=f"model={family['folder']},controller={spec.rule},{rule_args},gen_length={G},cache={cache}",
            device="cpu", batch_size=2)
        got = [s["resps"][0][0] for s in sorted(res["samples"]["adec_copy_gen"], key=lambda s: s["doc_id"])]
        assert got == [t.split("+")[0] for t in texts]
        assert res["config"]["adec_controller"] == spec.rule and res["config"]["adec_decode"]["cache"] == cache
        assert res["config"]["adec_mean_nfe"] == pytest.approx(nfe)

    class LocalTasks(lm_eval.tasks.TaskManager):  # only the fixture tasks: indexing lm-eval's own takes long
        def __init__(self, *a, **kw):
            super().__init__(*a, include_defaults=False, **kw)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasks)
    capsys.readouterr()
    assert main(["lm-eval", "run", "--model_args", f"model={family['folder']},controller={spec.rule},gen_length={G},"
                 f"cache={spec.cache}", "--tasks", "adec_copy_gen", "--include_path", str(LM_TASKS),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "adec_copy_gen" in out and "exact_match" in out


@pytest.mark.parametrize("which", [0, 1])
def test_lm_eval_model_refuses_what_the_model_refuses_when_built(family, no_forward, which):
    pytest.importorskip("lm_eval")
    from adaptive_decoding.framework.core.params import ParameterError
    from adaptive_decoding.framework.integrations.lm_eval_model import AdecLM

    sets, _, allowed = family["spec"].refusals[which]
    args = {k: (int(v) if v.isdigit() else v) for k, v in (s.split("=") for s in sets)}
    with pytest.raises(ParameterError, match=allowed.replace("(", r"\(").replace(")", r"\)")):
        AdecLM.create_from_arg_obj({"model": family["loaded"], "controller": family["spec"].rule, **args})
