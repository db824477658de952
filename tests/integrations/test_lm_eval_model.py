"""The ``adec`` model of lm-evaluation-harness (framework/integrations/lm_eval_model.py), end to end and offline.

Two local tasks (tests/fixtures/lm_eval: a generate_until task scored by exact_match and a multiple-
choice task scored by loglikelihood, each over a jsonl file) run through ``lm_eval.simple_evaluate``
and ``adec lm-eval`` on an untrained tiny denoiser and on a designed "echo" toy whose answers are known:
after the first '=' of a row, generation position j predicts the row's token j (then EOS).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read when datasets is imported: the jsonl files are local

lm_eval = pytest.importorskip("lm_eval")

from adaptive_decoding.framework.core.params import ParameterError  # noqa: E402
from adaptive_decoding.framework.core.registry import UnknownNameError  # noqa: E402
from adaptive_decoding.framework.core.rng import stable_seed  # noqa: E402
from adaptive_decoding.framework.engine.config import DecodeConfig  # noqa: E402
from adaptive_decoding.framework.engine.controller_io import build_controller  # noqa: E402
from adaptive_decoding.framework.engine.evaluate import item_seeds  # noqa: E402
from adaptive_decoding.framework.engine.loop import decode  # noqa: E402
from adaptive_decoding.framework.integrations.lm_eval_model import AdecLM, cut_at_stops  # noqa: E402
from adaptive_decoding.framework.integrations.mc_likelihood import MCRequest, mc_loglikelihoods  # noqa: E402
from adaptive_decoding.framework.models.protocol import LoadedModel  # noqa: E402
from adaptive_decoding.framework.testing.toys import CharTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "fixtures" / "lm_eval"
GEN_PROMPTS = ["1+2=", "34+5=", "7+89="]  # copy_gen.jsonl


class EchoToy(nn.Module):
    """After a row's first '=' (at column e), column e+1+j predicts the row's token j with probability
    ``p`` (j < e), else EOS; everything else is uniform. Reads only the prompt, never a masked token."""

    def __init__(self, tok: CharTokenizer, p: float = 0.9) -> None:
        super().__init__()
        self.vocab_size, self.mask_token_id = tok.vocab_size, tok.mask_token_id
        self.eos_token_id, self.pad_token_id = tok.eos_token_id, tok.pad_token_id
        self.eq, self.p = tok.encode("=")[0], p

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        b, length = x.shape
        probs = torch.full((b, length, self.vocab_size), (1 - self.p) / (self.vocab_size - 2),
                           dtype=torch.float64)
        probs[..., self.mask_token_id] = 1e-9
        for i in range(b):
            eq = (x[i] == self.eq).nonzero().flatten()
            if len(eq):
                e = int(eq[0])
                for col in range(e + 1, length):
                    j = col - e - 1
                    probs[i, col, int(x[i, j]) if j < e else self.eos_token_id] = self.p
        return (probs / probs.sum(-1, keepdim=True)).log().float()


def echo_model() -> LoadedModel:
    tok = CharTokenizer()
    return LoadedModel(denoiser=EchoToy(tok), tokenizer=tok, name="echo-toy")


@pytest.fixture
def lm_eval_env(monkeypatch, tmp_path):
    """Run at the repository root (the tasks' data_files are relative to it) with a private datasets cache."""
    import datasets

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """An untrained (seeded) tiny addition denoiser saved in this project's folder format."""
    from adaptive_decoding.experiments.cells import tiny_model
    from adaptive_decoding.framework.models.saved import save_pretrained
    from adaptive_decoding.framework.tasks.base import get_task

    folder = tmp_path_factory.mktemp("tiny") / "model"
    save_pretrained(folder, tiny_model(task="addition").denoiser, task=get_task("addition"), recipe={},
                    metrics={})
    return folder


def evaluate(model, tasks, **kw):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(TASKS), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=tm, log_samples=True,
                                   bootstrap_iters=0, **kw)


def samples(res, task):
    return sorted(res["samples"][task], key=lambda s: s["doc_id"])


# ------------------------------------------------------------------------------------------ generate_until
@pytest.mark.parametrize("settings", [
    dict(controller="fast_dllm", threshold=0.3, gen_length=8, block_length=4, cache="dual"),
    dict(controller="llada", steps=4, gen_length=8, block_length=4, cache="prefix"),
    dict(controller="eb", gamma=0.5, gen_length=8),
])
def test_generate_until_equals_decode(lm_eval_env, tiny_folder, settings):
    """Through lm-eval's own model_args string: each answer is decode()'s text for that prompt, cut at '+'."""
    from adaptive_decoding.framework.training.zoo import load_model

    args = ",".join([f"model={tiny_folder}"] + [f"{k}={v}" for k, v in settings.items()])
    res = evaluate("adec", ["adec_copy_gen"], model_args=args, device="cpu", batch_size=2)
    got = [s["resps"][0][0] for s in samples(res, "adec_copy_gen")]

    loaded = load_model(str(tiny_folder))
    opts = dict(settings)
    name = opts.pop("controller")
    ctrl_keys = set(build_controller(name).get_params())
    controller = build_controller(name, **{k: v for k, v in opts.items() if k in ctrl_keys})
    config = DecodeConfig.build(**{k: v for k, v in opts.items() if k not in ctrl_keys})
    tok = loaded.tokenizer
    out = decode(loaded.denoiser, [tok.encode(p) for p in GEN_PROMPTS], controller, config,
                 seeds=item_seeds([f"{p}\x1e1" for p in GEN_PROMPTS], config.seed))
    want = [tok.decode(out.generated[i].tolist()).split("+")[0] for i in range(len(GEN_PROMPTS))]
    assert got == want
    info = res["config"]
    assert info["adec_controller"] == name and info["adec_decode"]["cache"] == config.cache
    assert info["adec_mean_nfe"] == pytest.approx(float(out.nfe.float().mean()))


def test_until_cuts_the_text_and_exact_match_scores_it(lm_eval_env):
    loaded = echo_model()
    lm = AdecLM(model=loaded, gen_length=8, block_length=4, threshold=0.5, batch_size=3)
    with pytest.warns(UserWarning,
                      match="ignores lm-eval's generation kwargs max_gen_toks: decoding is set by "
                                         "--model_args \\(gen_length=8"):
        res = evaluate(lm, ["adec_copy_gen"], gen_kwargs={"max_gen_toks": 5, "temperature": 0})
    assert res["results"]["adec_copy_gen"]["exact_match,none"] == 1.0
    tok = loaded.tokenizer
    raw = decode(loaded.denoiser, [tok.encode(p) for p in GEN_PROMPTS],
                 build_controller("fast_dllm", threshold=0.5),
                 DecodeConfig.build(gen_length=8, block_length=4))
    for i, s in enumerate(samples(res, "adec_copy_gen")):
        full = tok.decode(raw.generated[i].tolist())
        assert full == GEN_PROMPTS[i][:-1]  # the echo: "34+5", stopped at EOS
        assert s["resps"][0][0] == full.split("+")[0] == s["target"]


def test_cut_at_stops_takes_the_earliest_stop():
    assert cut_at_stops("a;b:c", [":", ";"]) == "a"
    assert cut_at_stops("abc", "b") == "a"
    assert cut_at_stops("abc", None) == cut_at_stops("abc", []) == cut_at_stops("abc", ["", "x"]) == "abc"
    assert cut_at_stops("Q: 1\n\nQuestion: 2", ["Question:", "\n\n"]) == "Q: 1"


def test_batching_never_changes_a_text(lm_eval_env):
    texts = []
    for bs in (1, 3):
        lm = AdecLM(model=echo_model(), controller="llada_random", steps=8, gen_length=8, temperature=1.0,
                    batch_size=bs)
        texts.append([s["resps"][0][0] for s in samples(evaluate(lm, ["adec_copy_gen"]), "adec_copy_gen")])
    assert texts[0] == texts[1]


# ------------------------------------------------------------------------------------------ loglikelihood
def llada_reference(model, prefix, target, mc_num, seed, cfg=0.0):
    """LLaDA's eval_llada.py get_loglikelihood for one request and one batch of mc_num rows (its
    _forward_process with b = mc_num, its get_logits with cfg), the mask logit suppressed as in decoding."""
    g = torch.Generator().manual_seed(seed)
    mask_id = model.mask_token_id
    seq = torch.tensor(prefix + target)[None].repeat(mc_num, 1)
    b, t, p = mc_num, len(target), len(prefix)
    k = torch.randint(1, t + 1, (), generator=g)
    x = torch.round(torch.linspace(float(k), k + (b - 1) * (t / b), steps=b)).long()
    x = ((x - 1) % t) + 1
    is_mask = torch.arange(t).repeat(b, 1) < x[:, None]
    for i in range(b):
        is_mask[i] = is_mask[i][torch.randperm(t, generator=g)]
    is_mask = torch.cat([torch.zeros(b, p, dtype=torch.bool), is_mask], dim=1)
    noisy = torch.where(is_mask, mask_id, seq)
    logits = model(noisy).double()
    if cfg > 0:
        un = noisy.clone()
        un[:, :p] = mask_id
        un_logits = model(un).double()
        logits = un_logits + (cfg + 1) * (logits - un_logits)
    logits[..., mask_id] = torch.finfo(logits.dtype).min
    p_mask = (x / t)[:, None].repeat(1, seq.shape[1])
    loss = F.cross_entropy(logits[is_mask], seq[is_mask], reduction="none") / p_mask[is_mask]
    return -float(loss.sum() / b)


def test_loglikelihood_prefers_the_copy_and_matches_llada_reference(lm_eval_env):
    loaded = echo_model()
    lm = AdecLM(model=loaded, mc_num=16, batch_size=5, check_greedy=True)
    res = evaluate(lm, ["adec_copy_mc"])
    assert res["results"]["adec_copy_mc"]["acc,none"] == 1.0
    tok = loaded.tokenizer
    for s in samples(res, "adec_copy_mc"):
        doc = s["doc"]
        for c, choice in enumerate(doc["choices"]):
            ll, greedy = s["resps"][c][0]
            want = llada_reference(loaded.denoiser, tok.encode(doc["prompt"]), tok.encode(choice), 16,
                                   stable_seed(0, doc["prompt"], choice))
            assert ll == pytest.approx(want, rel=1e-5, abs=1e-6)
            assert greedy == (c == doc["label"])
        # the copy's positions are independent given the prompt: every sample gives exactly T log p
        right = doc["choices"][doc["label"]]
        assert s["resps"][doc["label"]][0][0] == pytest.approx(len(right) * math.log(0.9), abs=1e-4)


@pytest.mark.parametrize("cfg", [0.0, 0.5])
def test_mc_estimate_is_independent_of_batching(cfg):
    loaded = echo_model()
    tok = loaded.tokenizer
    reqs = [MCRequest(tok.encode(p), tok.encode(t), seed=s)
            for s, (p, t) in enumerate([("123=", "132"), ("45=", "4"), ("6078=", "60"), ("9=", "99999")])]
    one = mc_loglikelihoods(loaded.denoiser, reqs, mc_num=8, batch_size=1, cfg=cfg)
    many = mc_loglikelihoods(loaded.denoiser, reqs, mc_num=8, batch_size=7, cfg=cfg)
    assert one == pytest.approx(many, abs=1e-6)
    ref = [llada_reference(loaded.denoiser, list(r.prefix), list(r.target), 8, r.seed, cfg) for r in reqs]
    assert one == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert mc_loglikelihoods(loaded.denoiser, [MCRequest([1, 2], [])], mc_num=4) == [0.0]


def test_loglikelihood_rolling_is_refused_with_a_reason():
    lm = AdecLM(model=echo_model())
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling .*not supported.*LLaDA"):
        lm.loglikelihood_rolling([])


# ------------------------------------------------------------------------------------------ model_args errors
@pytest.mark.parametrize("args,error,match", [
    ("foo=1", ParameterError, (r"foo=1: unknown key\. adec options: .*mc_num.*; decoding options: "
                               r".*gen_length.*; fast_dllm parameters: threshold")),
    ("controller=llada,threshold=0.9", ParameterError, (r"threshold=0\.9: unknown key.*llada parameters: "
                                                        r"confidence_eos_inf, remasking, steps")),
    ("threshold=-1", ParameterError,
     r"fast_dllm\.threshold=-1 is out of range; allowed: number in \[0, inf\)"),
    ("gen_length=8,block_length=3", ParameterError, r"block_length=3 does not divide gen_length=8"),
    ("cache=full", ParameterError, r"cache='full' is not allowed; allowed: one of 'none', 'prefix', 'dual'"),
    ("mc_num=0", ParameterError, r"adec\.mc_num=0 is out of range"),
    ("batch_size=auto", ParameterError, r"batch_size='auto' is not supported"),
    ("controller=fastest", UnknownNameError, r"unknown controller 'fastest'.*fast_dllm"),
    ("cache=dual", ParameterError, r"cache='dual' needs a denoiser with a KV cache"),
])
def test_bad_model_args_fail_before_any_work(args, error, match):
    with pytest.raises(error, match=match):
        AdecLM.create_from_arg_obj({"model": echo_model(), **lm_eval.utils.simple_parse_args_string(args)})


def test_model_is_required_and_named_as_the_cli_names_it(tmp_path):
    with pytest.raises(ParameterError, match="needs model=NAME"):
        AdecLM.create_from_arg_string("controller=fast_dllm")
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        AdecLM.create_from_arg_string(f"model={tmp_path / 'missing'}/", {"device": "cpu"})


# ------------------------------------------------------------------------------------------ the adec CLI
def test_adec_lm_eval_runs_lm_evals_cli(lm_eval_env, tiny_folder, monkeypatch, capsys):
    import lm_eval.tasks

    from adaptive_decoding.framework.cli.lm_eval import lm_eval_argv
    from adaptive_decoding.framework.cli.main import main

    class LocalTasks(lm_eval.tasks.TaskManager):  # only the fixture tasks: indexing lm-eval's own takes long
        def __init__(self, *a, **kw):
            super().__init__(*a, include_defaults=False, **kw)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasks)
    common = ["--tasks", "adec_copy_gen", "--include_path", str(TASKS), "--device", "cpu"]
    assert lm_eval_argv(["--tasks", "x"]) == ["lm-eval", "--tasks", "x", "--model", "adec"]
    assert lm_eval_argv(["ls", "tasks"]) == ["lm-eval", "ls", "tasks"]
    assert main(["lm-eval", "run", "--model_args", f"model={tiny_folder},gen_length=8,block_length=4",
                 *common]) == 0
    out = capsys.readouterr().out
    assert "adec_copy_gen" in out and "exact_match" in out
    assert main(["lm-eval", "--model_args", f"model={tiny_folder},bogus=1", *common]) == 2
    assert "adec lm-eval: error: --model_args bogus=1: unknown key" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ HF tokenizers
def test_chat_templates_are_applied_once(tmp_path):
    """An instruct tokenizer wraps generation prompts (as adec decode does); loglikelihood tokenizes
    plainly (as LLaDA's evaluation); after lm-eval's --apply_chat_template nothing is wrapped twice."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from adaptive_decoding.framework.models.hub_loading import HFTokenizer

    vocab = ["[PAD]", "[UNK]", "[EOS]", "[MASK]", "hello", "world", "user", "assistant", "="]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                  eos_token="[EOS]")
    raw.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}assistant{% endif %}")
    tok = HFTokenizer(raw, mask_token_id=3, eos_token_id=2, pad_token_id=0, chat=True)
    den = EchoToy(CharTokenizer())
    den.vocab_size, den.mask_token_id = len(vocab), 3
    lm = AdecLM(model=LoadedModel(denoiser=den, tokenizer=tok, name="chat-toy"))
    ids = {w: i for i, w in enumerate(vocab)}
    assert lm._prompt_ids("hello") == [ids["user"], ids["hello"], ids["assistant"]] == tok.encode("hello")
    assert lm._encode_pair("hello ", "world") == ([ids["hello"]], [ids["world"]])
    templated = lm.apply_chat_template([{"role": "user", "content": "hello"}])
    assert lm._prompt_ids(templated) == [ids["user"], ids["hello"], ids["assistant"]]
    assert lm.chat_template() == raw.chat_template
