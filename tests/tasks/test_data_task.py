"""The ``data`` task (framework/tasks/data.py) and the ``lm_eval`` task (framework/tasks/lm_eval_task.py)
over the fixtures written by tests/fixtures/data/build.py: splits, few-shot, templates, stop strings,
every bad input, lm-eval's own accuracy for the same generations, and one decode end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, get_task
from adaptive_decoding.framework.tasks.data import DataTaskError, cut_at_stops, template_keys

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "data"


def _builder():
    spec = importlib.util.spec_from_file_location("_adec_data_fixtures", FIXTURES / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return _builder().build_all(tmp_path_factory.mktemp("data"))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def gsm8k(files, **kw):
    return get_task("data", train=str(files["gsm8k_train"]), test=str(files["gsm8k_test"]),
                    template="Question: {question}\nAnswer:", **kw)


# ----------------------------------------------------------------------------- fixtures
def test_committed_fixtures_are_what_the_builder_writes(tmp_path):
    _builder().build_all(tmp_path, data_root="tests/fixtures/data")
    for name in ("gsm8k_train.jsonl", "gsm8k_test.jsonl", "math.jsonl", "code.jsonl", "gsm8k_local.yaml"):
        assert (tmp_path / name).read_text() == (FIXTURES / name).read_text(), name


def test_fixture_formats(files):
    g = rows(files["gsm8k_test"])
    assert len(g) == 20 and all(r["answer"].rsplit("\n", 1)[1].startswith("#### ") for r in g)
    assert all("<<" in r["answer"] for r in g)
    m = rows(files["math"])
    assert all(f"\\boxed{{{r['answer']}}}" in r["solution"] for r in m)
    for r in rows(files["code"]):  # the canonical solution passes the row's own test
        scope: dict = {}
        exec(r["prompt"] + r["canonical_solution"] + "\n" + r["test"], scope)
        scope["check"](scope[r["entry_point"]])


def test_data_and_lm_eval_are_registered():
    assert {"data", "lm_eval"} <= set(TASKS.names())


# ----------------------------------------------------------------------------- splits
def test_split_files_give_the_test_split_whole_and_carve_validation_from_train(files):
    task = gsm8k(files)
    test = task.examples("test", 20)
    assert [ex.answer for ex in test] == [r["answer"] for r in rows(files["gsm8k_test"])]
    train, val = task.split_rows("train"), task.split_rows("validation")
    assert val and len(train) + len(val) == 40
    key = lambda r: r["question"]  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in val}
    assert sorted(map(key, train + val)) == sorted(map(key, rows(files["gsm8k_train"])))
    assert all(task.split_of(task.render_prompt(r)) == "validation" for r in val)
    assert not {ex.meta["question"] for ex in test} & {key(r) for r in train + val}


def test_one_file_is_split_by_the_project_hash(files):
    task = get_task("data", path=str(files["math"]), prompt="problem", answer="answer")
    parts = {s: task.split_rows(s) for s in ("train", "validation", "test")}
    problems = {s: {r["problem"] for r in p} for s, p in parts.items()}
    assert sum(len(p) for p in parts.values()) == 30 and all(parts.values())
    assert not (problems["train"] & problems["test"]) and not (problems["validation"] & problems["test"])
    for split, part in parts.items():
        assert all(task.split_of(r["problem"]) == split for r in part)
    assert [e.id for e in task.examples("test", 2)] == [e.id for e in task.examples("test", 2, seed=5)]


def test_a_dataset_in_the_local_cache_is_read_offline_with_its_own_splits(tmp_path, monkeypatch, files):
    import datasets

    train, test = rows(files["gsm8k_train"]), rows(files["gsm8k_test"])[:6]
    _builder().fake_datasets_cache(tmp_path / "cache", "adec-test/gsm8k-like", "main", {"train": train, "test": test})
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    task = get_task("data", dataset="adec-test/gsm8k-like", config="main", prompt="question")
    assert [ex.meta["question"] for ex in task.examples("test", 6)] == [r["question"] for r in test]
    held = task.split_rows("validation")
    assert held and len(held) + len(task.split_rows("train")) == len(train)
    with pytest.raises(DataTaskError, match=r"split='dev' is not a split of dataset .*allowed: (train, test|test, train)"):
        get_task("data", dataset="adec-test/gsm8k-like", config="main", split="dev", prompt="question")


def test_a_missing_split_names_the_parameter_to_give(files):
    task = get_task("data", test=str(files["gsm8k_test"]), prompt="question")
    with pytest.raises(DataTaskError, match="no validation split; give validation=FILE"):
        task.examples("validation", 1)
    with pytest.raises(DataTaskError, match="fewer than n=21"):
        task.examples("test", 21)


# ----------------------------------------------------------------------------- prompts
def test_template_column_answer_template_and_meta(files):
    task = get_task("data", path=str(files["math"]), template="Problem: {problem}\nSolution:",
                    answer="The answer is {answer}.")
    ex = task.examples("test", 1)[0]
    row = ex.meta
    assert ex.prompt == f"Problem: {row['problem']}\nSolution:"
    assert ex.answer == f"The answer is {row['answer']}."
    assert {"problem", "solution", "level", "type", "answer", "row_index", "data_split"} <= set(row)
    code = get_task("data", path=str(files["code"]), prompt="prompt", answer="canonical_solution")
    ex = code.examples("test", 1)[0]
    assert ex.prompt.startswith("def ") and ex.meta["entry_point"] in ex.prompt and "check" in ex.meta["test"]
    assert template_keys("Q: {question} {a[0]} {{x}}") == ["question", "a"]


def test_few_shot_is_a_fixed_seeded_draw_from_train(files):
    task = gsm8k(files, few_shot=3, separator="\n\n")
    a, b = task.examples("test", 4), gsm8k(files, few_shot=3).examples("test", 4)
    assert [e.prompt for e in a] == [e.prompt for e in b]
    train_questions = {r["question"] for r in task.split_rows("train")}
    shots = task.shots()
    assert len(shots) == 3 and all(s["question"] in train_questions for s in shots)
    blocks = a[0].prompt.split("\n\n")
    assert len(blocks) == 4 and blocks[-1] == task.render_prompt(a[0].meta)
    assert blocks[0] == f"Question: {shots[0]['question']}\nAnswer: {shots[0]['answer']}"
    other = gsm8k(files, few_shot=3, few_shot_seed=7).shots()
    assert [s["question"] for s in other] != [s["question"] for s in shots]


def test_few_shot_from_a_file_and_the_item_is_never_its_own_shot(files):
    task = get_task("data", test=str(files["gsm8k_test"]), prompt="question", few_shot=2,
                    few_shot_path=str(files["gsm8k_test"]))
    for ex in task.examples("test", 20):
        assert ex.prompt.count(ex.meta["question"]) == 1


def test_generation_settings_and_chat(files):
    task = gsm8k(files)
    assert (task.gen_length, task.default_block_length, task.until) == (256, 32, None)
    assert task.model_chat() is None
    assert gsm8k(files, chat=False).model_chat() is False and gsm8k(files, chat=True).model_chat() is True
    assert gsm8k(files, gen_length=16, block_length=32).default_block_length == 16
    with pytest.raises(ParameterError, match="chat"):
        gsm8k(files, chat="sometimes")
    with pytest.raises(DataTaskError, match="no vocabulary of its own"):
        task.tokenizer  # noqa: B018


# ----------------------------------------------------------------------------- scoring
def test_output_is_cut_at_the_first_stop_string_before_scoring(files):
    task = gsm8k(files, until=["Question:", "\n\n"])
    ex = task.examples("test", 1)[0]
    assert task.score(ex, ex.answer + "\n\nQuestion: more") == 1.0
    assert task.score(ex, ex.answer + " and more") == 0.0
    assert gsm8k(files).score(ex, ex.answer + "\n\nQuestion: more") == 0.0  # no until: nothing is cut
    assert task.scores(ex, ex.answer + "Question:") == {"exact_match": 1.0}
    assert gsm8k(files, until="Question:").until == ["Question:"]
    assert cut_at_stops("a STOP b stop", ["stop", "STOP"]) == "a " and cut_at_stops("abc", None) == "abc"


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("params, message", [
    (dict(path="nope.jsonl", prompt="q"), r"path='nope.jsonl': no such file .*allowed: a .jsonl"),
    (dict(prompt="q"), r"give exactly one source.*given: none"),
    (dict(path="{math}", test="{math}", prompt="problem"), r"given: path, train/validation/test"),
    (dict(path="{math}", prompt="question"), r"prompt='question' is not a column .*columns: .*problem.*solution"),
    (dict(path="{math}", prompt="problem", answer="result"), r"answer='result' is not a column .*columns:"),
    (dict(path="{math}", template="Q: {problm}"), r"template='Q: \{problm\}' names 'problm', not a column.*columns:"),
    (dict(path="{math}", prompt="problem", answer="{soln}"), r"answer='\{soln\}' names 'soln'"),
    (dict(path="{math}"), r"exactly one of prompt=COLUMN or template"),
    (dict(path="{math}", prompt="problem", metric="bleu9"), r"unknown answer metric 'bleu9'.*Known answer metrics: .*exact"),
    (dict(path="{math}", prompt="problem", few_shot=40), r"few_shot=40 needs at least 41 rows"),
    (dict(path="{math}", prompt="problem", until=[""]), r"until=\[''\] is not allowed"),
    (dict(dataset="adec-no-such/dataset", config="main", prompt="question"),
     r"not in the local Hugging Face datasets cache.*python -c \"import datasets; "
     r"datasets.load_dataset\('adec-no-such/dataset', 'main'\)\""),
])
def test_bad_input_fails_at_build_naming_what_is_allowed(files, params, message):
    params = {k: v.format(math=files["math"]) if isinstance(v, str) and v == "{math}" else v for k, v in params.items()}
    with pytest.raises(ParameterError, match=message):
        get_task("data", **params)


def test_empty_and_unknown_files_fail_at_build(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataTaskError, match="has no rows"):
        get_task("data", path=str(tmp_path / "empty.jsonl"), prompt="q")
    (tmp_path / "data.txt").write_text("x\n")
    with pytest.raises(DataTaskError, match=r"unknown file type .txt; allowed: .jsonl, .json, .csv, .parquet"):
        get_task("data", path=str(tmp_path / "data.txt"), prompt="q")


def test_csv_json_and_parquet_read_alike(tmp_path, files):
    import pandas as pd

    frame = pd.DataFrame(rows(files["gsm8k_test"]))
    frame.to_csv(tmp_path / "g.csv", index=False)
    frame.to_parquet(tmp_path / "g.parquet")
    (tmp_path / "g.json").write_text(json.dumps(rows(files["gsm8k_test"])))
    want = [ex.prompt for ex in get_task("data", test=str(files["gsm8k_test"]), prompt="question").examples("test", 20)]
    for name in ("g.csv", "g.parquet", "g.json"):
        got = get_task("data", test=str(tmp_path / name), prompt="question").examples("test", 20)
        assert [ex.prompt for ex in got] == want, name


def test_experiment_yaml_builds_the_data_task(files):
    from adaptive_decoding.experiments.spec import TaskSpec

    spec = TaskSpec(name="data", params={"test": str(files["gsm8k_test"]), "prompt": "question",
                                         "until": ["Question:"], "metric": "exact", "metric_params": None})
    task = spec.build()
    assert task.examples("test", 2)[0].prompt == rows(files["gsm8k_test"])[0]["question"]


# ----------------------------------------------------------------------------- lm-eval
lm_eval = pytest.importorskip("lm_eval")


def lm_task(files, **kw):
    return get_task("lm_eval", task="gsm8k_local", include_path=str(files["lm_eval_yaml"].parent),
                    include_defaults=False, **kw)


def designed_outputs(examples) -> list[str]:
    """Strict-correct (with a following question to cut), flexible-only correct, wrong, and an output
    that is right only once it is cut at ``Question:``."""
    out = []
    for i, ex in enumerate(examples):
        gold = ex.answer.rsplit("#### ", 1)[1]
        out.append([f"{ex.answer}\n\nQuestion: what next?", f"So the answer is {gold}.",
                    f"#### {int(gold) + 1}", f"#### {gold}\nQuestion: and?\nAnswer: #### 999"][i % 4])
    return out


def test_lm_eval_accuracy_equals_lm_evals_own_evaluation(files):
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    task = lm_task(files, num_fewshot=2)
    examples = task.examples("test", 20)
    texts = designed_outputs(examples)
    by_context = {ex.prompt: t for ex, t in zip(examples, texts)}

    class Canned(LM):  # lm-eval's models cut at the request's until; so does this one
        def generate_until(self, requests, disable_tqdm=False):
            return [cut_at_stops(by_context[r.args[0]], r.args[1]["until"]) for r in requests]

        def loglikelihood(self, requests, disable_tqdm=False):  # pragma: no cover
            raise NotImplementedError

        loglikelihood_rolling = loglikelihood

    manager = TaskManager(include_path=str(files["lm_eval_yaml"].parent), include_defaults=False)
    res = simple_evaluate(model=Canned(), tasks=["gsm8k_local"], num_fewshot=2, task_manager=manager)
    theirs = res["results"]["gsm8k_local"]
    ours = [task.scores(ex, t) for ex, t in zip(examples, texts)]
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert sum(s[key] for s in ours) / len(ours) == pytest.approx(theirs[key])
    assert sum(task.score(ex, t) for ex, t in zip(examples, texts)) / 20 == pytest.approx(
        theirs["exact_match,strict-match"])
    assert 0 < theirs["exact_match,strict-match"] < theirs["exact_match,flexible-extract"] < 1


def test_lm_eval_prompts_few_shot_until_and_splits(files):
    task = lm_task(files, num_fewshot=2, gen_length=64)
    ex = task.examples("test", 1)[0]
    assert ex.prompt.count("Question:") == 3 and ex.prompt.endswith("Answer:")
    assert ex.meta["until"] == ["Question:", "</s>", "<|im_end|>"]
    assert (task.gen_length, task.default_block_length) == (64, 32)
    assert len(task.examples("train", 40)) == 40
    with pytest.raises(ParameterError, match="no validation documents.*allowed splits: test, train"):
        task.examples("validation", 1)
    assert task.scores(ex, ex.answer) == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
    flex = lm_task(files, num_fewshot=2, headline="exact_match,flexible-extract")
    assert flex.score(ex, "it is " + ex.answer.rsplit("#### ", 1)[1]) == 1.0 and task.score(ex, "it is 3") == 0.0


@pytest.mark.parametrize("params, message", [
    (dict(task="gsm8k_locl"), r"not an lm-eval task; did you mean \['gsm8k_local'\]"),
    (dict(task="gsm8k_local", include_path="/no/such/dir"), r"include_path='/no/such/dir' is not a folder"),
])
def test_lm_eval_bad_input(files, params, message):
    params.setdefault("include_path", str(files["lm_eval_yaml"].parent))
    with pytest.raises(ParameterError, match=message):
        get_task("lm_eval", include_defaults=False, **params)


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def llada_and_data(tmp_path_factory):
    """A LLaDA-format checkpoint (designed remote-code model, word-level tokenizer) and a JSONL file of
    four prompts whose answers are the model's words up to the stop word ``w0`` (the last one wrong)."""
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from test_hub import VOCAB, designed_answer
    from test_model_loading import llada_checkpoint

    from adaptive_decoding.framework.models.hub_loading import load_hub_model

    folder = llada_checkpoint(tmp_path_factory.mktemp("e2e") / "llada")
    loaded = load_hub_model(str(folder), trust_remote_code=True)
    data = []
    for i, p in enumerate(["hello w1", "world w2", "w3 hello", "w6 world"]):
        words = [VOCAB[t] for t in designed_answer(loaded.tokenizer.encode(p), 16)]
        answer = " ".join(words[: words.index("w0")])
        data.append({"question": p, "answer": answer if i != 3 else "w1 w2"})
    path = folder.parent / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return loaded, folder, path


def test_data_task_decodes_end_to_end_with_a_tiny_llada_checkpoint(llada_and_data):
    """adaptive_decoding.framework.engine.evaluate on the data task with a LLaDA-format checkpoint and a real tokenizer:
    the designed model's words, cut at the stop word, scored against the file's answers."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate

    loaded, _, path = llada_and_data
    task = get_task("data", test=str(path), prompt="question", until=["w0"], gen_length=16, block_length=16)
    config = DecodeConfig.build(gen_length=task.gen_length, block_length=task.default_block_length)
    res = evaluate(loaded, task, build_controller("fast_dllm"), config, n=4)
    assert [s.correct for s in res.samples] == [1.0, 1.0, 1.0, 0.0] and res.accuracy == 0.75
    assert all(len(s.output.split()) == 16 for s in res.samples)  # the raw output is kept whole


def test_adec_run_takes_the_data_task_from_an_experiment_file(llada_and_data, tmp_path):
    from adaptive_decoding.framework.cli.main import main

    _, folder, path = llada_and_data
    exp = tmp_path / "mydata.yaml"
    exp.write_text(f"""name: mydata
model: {{name: {folder}, trust_remote_code: true}}
device: cpu
n: 4
batch_size: 4
seeds: [0]
tasks:
  - {{name: data, params: {{test: {path}, prompt: question, until: ["w0"], gen_length: 16, block_length: 16}}}}
strategies:
  - {{label: llada, controller: llada, params: {{steps_per_token: 0.5}}}}
""")
    assert main(["run", str(exp), "--out", str(tmp_path / "runs"), "--wandb", "disabled"]) == 0
    rows_ = json.loads((tmp_path / "runs" / "mydata" / "summary.json").read_text())
    assert [(r["accuracy"], r["nfe"]) for r in rows_] == [(0.75, 8.0)]
