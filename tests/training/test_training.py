"""The masked-diffusion loss, the data layout, training end to end, saving and loading models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode, layout
from adaptive_decoding.framework.models.saved import (
    CheckpointError,
    default_cache_dir,
    load_pretrained,
    model_dir,
    save_pretrained,
)
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.training.data import collate, encode_example
from adaptive_decoding.framework.training.masked_diffusion import (
    MaskedDiffusionLM,
    exact_match,
    forward_process,
    masked_diffusion_loss,
    sample_t,
    train_denoiser,
)
from adaptive_decoding.framework.training.zoo import MODELS, load_model

TINY = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _batch(task_name="sorting", n=8, **params):
    task = get_task(task_name, **params)
    return task, collate(task, task.examples("train", n, seed=0))


# ---------------------------------------------------------------------- data layout
def test_rows_match_the_decoding_layout():
    task, batch = _batch("sorting", 6)
    tok = task.tokenizer
    prompts = [task.prompt_ids(e) for e in batch["examples"]]
    canvas, attn, start = layout(prompts, task.gen_length, tok.mask_token_id, tok.pad_token_id)
    L = canvas.shape[1]
    assert torch.equal(batch["prompt_length"], start)
    assert torch.equal(batch["attention_mask"][:, :L], attn)
    # where the loop has masks, the training row has the answer; elsewhere they agree
    where_mask = canvas == tok.mask_token_id
    assert torch.equal(where_mask, batch["answer_mask"][:, :L])
    assert torch.equal(canvas[~where_mask], batch["input_ids"][:, :L][~where_mask])
    for row, ex in zip(batch["input_ids"], batch["examples"]):
        n = len(task.prompt_ids(ex))
        assert tok.decode(row[n:].tolist()) == ex.answer


def test_encode_example_rejects_a_row_too_long():
    task = get_task("addition")
    ex = task.examples("train", 1)[0]
    with pytest.raises(ValueError, match="more than length=5"):
        encode_example(task, ex, length=5)


# ---------------------------------------------------------------------- the loss
def test_forward_process_masks_only_answer_positions():
    task, batch = _batch("sorting", 64)
    x0, ans = batch["input_ids"], batch["answer_mask"]
    g = torch.Generator().manual_seed(0)
    x_t, masked, p = forward_process(x0, ans, 1, torch.ones(64), eps=1e-3, generator=g)
    assert torch.equal(masked, ans)  # t = 1: every answer position masked
    assert torch.equal(x_t[~ans], x0[~ans])  # prompt and padding untouched
    assert torch.all(x_t[ans] == 1)
    x_t, masked, p = forward_process(x0, ans, 1, torch.zeros(64), eps=0.0, generator=g)
    assert not masked.any()
    assert torch.allclose(p, torch.zeros(64))
    t = torch.full((64,), 0.5)
    _, masked, p = forward_process(x0, ans, 1, t, eps=1e-3, generator=g)
    frac = masked.sum() / ans.sum()
    assert 0.4 < float(frac) < 0.6 and torch.allclose(p, torch.full((64,), 0.5 * 0.999 + 1e-3))


def test_loss_weights_masked_cross_entropy_by_one_over_t():
    B, L, V = 3, 5, 7
    logits = torch.zeros(B, L, V)  # uniform: CE = log V at every position
    x0 = torch.zeros(B, L, dtype=torch.long)
    answer = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    masked = torch.tensor([[0, 1, 0, 1, 0], [0, 0, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    p = torch.tensor([0.5, 0.25, 1.0])
    loss = masked_diffusion_loss(logits, x0, masked, p, answer)
    logv = math.log(V)
    # masked counts: 2, 2, 1 (row 2's mask is outside the answer but counts only if passed as masked)
    expected = ((2 * logv / 0.5) / 4 + (2 * logv / 0.25) / 2 + (1 * logv / 1.0) / 4) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    # a perfect prediction at the masked positions gives zero loss
    perfect = torch.full((B, L, V), -30.0)
    perfect[..., 0] = 30.0
    assert float(masked_diffusion_loss(perfect, x0, masked, p, answer)) < 1e-6


def test_low_discrepancy_t_is_stratified():
    t = sample_t(8, True, torch.Generator().manual_seed(1))
    s = torch.sort(t).values
    assert torch.allclose(s[1:] - s[:-1], torch.full((7,), 1 / 8), atol=1e-6)
    assert ((t >= 0) & (t < 1)).all()


def test_module_loss_never_sees_prompt_tokens():
    """Changing the prompt's target changes nothing: the loss gradient of the prompt logits is zero."""
    task, batch = _batch("addition", 16)
    module = MaskedDiffusionLM(task="addition", model=TINY)
    captured = {}

    def hook(_m, _inp, out):
        out.retain_grad()
        captured["logits"] = out

    module.denoiser.head.register_forward_hook(hook)
    loss = module._loss(batch, generator=torch.Generator().manual_seed(0))
    loss.backward()
    grad = captured["logits"].grad
    assert grad[batch["prompt_mask"]].abs().max() == 0
    assert grad[batch["answer_mask"]].abs().max() > 0


def test_schedule_warms_up_then_decays():
    m = MaskedDiffusionLM(task="addition", model=TINY, warmup_steps=10, max_steps=100)
    assert m.lr_factor(0) == pytest.approx(0.1)
    assert m.lr_factor(9) == pytest.approx(1.0)


# ---------------------------------------------------------------------- end to end
def test_train_then_decode_beats_the_untrained_model(tmp_path):
    task = get_task("sorting", min_length=3, max_length=3)
    test = task.examples("test", 100, seed=0)
    torch.manual_seed(0)
    untrained = TinyDenoiser(TinyConfig(vocab_size=task.tokenizer.vocab_size, mask_token_id=1, pad_token_id=0,
                                        eos_token_id=2, max_len=task.canvas_length, **TINY)).eval()
    before = exact_match(untrained, task, test)
    result = train_denoiser(task, max_steps=150, max_minutes=1.0, model_size=TINY, out_dir=tmp_path / "m",
                            wandb_mode="disabled", progress=False, batch_size=64, lr=3e-3, warmup_steps=20,
                            val_size=64, val_every=75, n_test=100, num_threads=1)
    assert before < 0.1
    assert result.test_accuracy >= max(0.6, before + 0.5)  # measured 0.87 (seed 0), untrained 0.0
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert metrics["test_exact_match"] == result.test_accuracy and metrics["n_test"] == 100
    assert (tmp_path / "m" / "lightning" / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "m" / "lightning" / "csv").glob("version_*/metrics.csv"))
    loaded = load_model(str(tmp_path / "m"))
    assert loaded.task == "sorting" and loaded.info["metrics"]["test_exact_match"] == result.test_accuracy
    assert exact_match(loaded.denoiser, task, test) == pytest.approx(result.test_accuracy)
    out = decode(loaded.denoiser, [loaded.tokenizer.encode("sort:931=")], build_controller("sequential"),
                 DecodeConfig(gen_length=task.gen_length))
    assert out.nfe.tolist() == [task.gen_length]


# ---------------------------------------------------------------------- saving and loading
def _saved(tmp_path):
    task = get_task("addition")
    tok = task.tokenizer
    torch.manual_seed(0)
    net = TinyDenoiser(TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  max_len=task.canvas_length, **TINY))
    folder = save_pretrained(tmp_path / "saved", net, task=task, recipe={"size": "x"}, metrics={"test_exact_match": 0.5})
    return net, folder


def test_save_load_round_trip_without_lightning(tmp_path):
    net, folder = _saved(tmp_path)
    loaded = load_pretrained(folder)
    x = torch.randint(0, net.vocab_size, (2, 10))
    assert torch.equal(net.eval()(x), loaded.denoiser(x))
    assert loaded.tokenizer.mask_token_id == loaded.denoiser.mask_token_id
    assert loaded.info["metrics"]["test_exact_match"] == 0.5


def test_corrupt_or_missing_files_name_the_file_and_delete_nothing(tmp_path):
    _, folder = _saved(tmp_path)
    (folder / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"model\.pt: cannot be read"):
        load_model(str(folder))
    assert (folder / "model.pt").read_bytes() == b"not a checkpoint"
    (folder / "model.pt").unlink()
    with pytest.raises(CheckpointError, match=r"model\.pt: file not found"):
        load_model(str(folder))
    (folder / "config.json").write_text("{ broken")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_model(str(folder))
    assert (folder / "config.json").read_text() == "{ broken"
    with pytest.raises(CheckpointError, match=r"nowhere.*no such model folder"):
        load_model(str(tmp_path / "nowhere"))
    assert isinstance(CheckpointError("x"), FileNotFoundError)


def test_mismatched_weights_are_reported(tmp_path):
    _, folder = _saved(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"]["d_model"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.pt: does not match .*config\.json"):
        load_pretrained(folder)


def test_builtin_names_cache_and_errors(tmp_path):
    assert {"tiny-addition", "tiny-sorting", "tiny-sudoku", "tiny-pairs"} <= set(MODELS.names())
    assert default_cache_dir() == tmp_path / "cache"
    with pytest.raises(UnknownNameError, match="tiny-addition.*tiny-sudoku|tiny-addition"):
        load_model("tiny-multiplication")
    with pytest.raises(CheckpointError, match=r"tiny-pairs.config\.json: file not found.*not trained yet"):
        load_model("tiny-pairs", train_if_missing=False)
    # a model placed in the cache is loaded by name, without training
    _, folder = _saved(tmp_path)
    target = model_dir("tiny-addition")
    target.parent.mkdir(parents=True)
    folder.rename(target)
    with pytest.warns(UserWarning, match="older recipe"):
        loaded = load_model("tiny-addition", train_if_missing=False)
    assert loaded.name == "tiny-addition" and loaded.task == "addition"


def test_hugging_face_folder_is_delegated_to_the_hub_adapter(tmp_path, monkeypatch):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    calls = []
    monkeypatch.setattr("adaptive_decoding.framework.models.hub_loading.load_hub_model",
                        lambda path, **kw: calls.append((path, kw)) or "hub-model")
    assert load_model(str(folder)) == "hub-model"
    # remote code stays off unless asked for; the chat template follows the tokenizer (None)
    assert calls == [(str(folder), {"device": "cpu", "dtype": None, "trust_remote_code": False, "chat": None, "query_chunk": None})]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"empty.config\.json: file not found"):
        load_model(str(empty))


def test_cli_train_denoiser_prints_accuracy_and_checkpoint(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    out = tmp_path / "cli"
    rc = main(["train-denoiser", "--task", "pairs", "--max-steps", "3", "--size", "tiny", "--wandb", "disabled",
               "--out", str(out), "--no-progress", "--n-test", "20"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "test exact match (pairs, one token per step):" in text and "on 20 test problems" in text
    assert f"checkpoint: {out}" in text
    assert (out / "model.pt").is_file()
    # without --out: trained under runs/, then moved into the free cache entry of tiny-pairs
    quick = ["train-denoiser", "--task", "pairs", "--max-steps", "2", "--size", "tiny", "--wandb", "disabled",
             "--no-progress", "--n-test", "20"]
    assert main(quick) == 0
    assert f"checkpoint: {model_dir('tiny-pairs')}" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="older recipe"):  # --size tiny differs from the default recipe
        assert load_model("tiny-pairs", train_if_missing=False).task == "pairs"
    before = (model_dir("tiny-pairs") / "model.pt").read_bytes()
    assert main(quick + ["--seed", "1"]) == 0  # the cache entry exists: left alone
    assert f"checkpoint: {default_cache_dir() / 'runs'}" in capsys.readouterr().out
    assert (model_dir("tiny-pairs") / "model.pt").read_bytes() == before
    with pytest.raises(SystemExit):
        main(["train-denoiser", "--help"])
    assert "--minutes" in capsys.readouterr().out


@pytest.mark.slow
def test_default_addition_recipe_reaches_95_percent(tmp_path):
    result = train_denoiser("addition", out_dir=tmp_path / "add", wandb_mode="disabled", progress=False)
    print(result.summary())
    assert result.test_accuracy >= 0.95
