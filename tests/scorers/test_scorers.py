"""Scorers rank hand-made candidates as designed; specs parse into weighted mixtures."""

from __future__ import annotations

import math

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.scorer import (
    SCORERS,
    Candidates,
    ScoringContext,
    build_scorer,
    parse_components,
    parse_scorer_spec,
)
from adaptive_decoding.framework.testing.toys import CharTokenizer
from adaptive_decoding.framework.training.causal_lm import CausalConfig, CausalLM

TOK = CharTokenizer()


def text_candidates(texts, prompt="", g=None, source=None):
    g = g or max(len(t) for t in texts) + 1
    tokens = torch.full((len(texts), g), TOK.eos_token_id, dtype=torch.long)
    for i, t in enumerate(texts):
        ids = TOK.encode(t)
        if ids:
            tokens[i, : len(ids)] = torch.tensor(ids)
    p = torch.tensor([TOK.encode(prompt)] * len(texts), dtype=torch.long).reshape(len(texts), -1)
    return Candidates(tokens=tokens, prompt_ids=p, source=source)


CTX = ScoringContext(tokenizer=TOK)


# ---------------------------------------------------------------------- logprob
def test_logprob_is_geometric_mean_minus_one_over_recorded_positions():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.1], [0.9, 0.1, 0.1], [0.2, 0.2, 0.2]]))
    mask = torch.tensor([[True, True, False], [True, True, False], [False, False, False]])
    c = Candidates(tokens=torch.zeros(3, 3, dtype=torch.long), logprobs=lp, logprob_mask=mask)
    s = build_scorer("logprob").score(c)
    assert s.tolist() == pytest.approx([0.5 - 1, math.sqrt(0.09) - 1, 0.0], abs=1e-6)
    assert s[0] > s[1]  # joint 0.25 beats 0.09: the likelier pair wins


def test_logprob_without_recorded_logprobs_fails_clearly():
    with pytest.raises(ValueError, match="logprobs"):
        build_scorer("logprob").score(Candidates(tokens=torch.zeros(2, 3, dtype=torch.long)))


# ---------------------------------------------------------------------- repetition
def test_repetition_repeated_candidate_loses_and_fraction_is_exact():
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 3, 4, 3, 4], [3, 4, 5, 0, 0, 0]])
    eos = TOK.eos_token_id
    tokens[2, 3:] = eos  # trailing EOS padding is no repetition
    s = build_scorer("repetition", n=2).score(Candidates(tokens=tokens), CTX)
    # row 1: bigrams 34 43 34 43 34 -> 5 n-grams, 2 distinct -> 3/5 repeated
    assert s.tolist() == pytest.approx([0.0, -0.6, 0.0], abs=1e-6)


def test_repetition_ignores_undecided_positions():
    tokens = torch.tensor([[3, 4, 3, 4]])
    decided = torch.tensor([[True, True, False, True]])
    s = build_scorer("repetition", n=2).score(Candidates(tokens=tokens, decided=decided), CTX)
    assert s.tolist() == [0.0]  # only the bigram (3, 4) at 0-1 is complete


def test_repetition_on_text_words_repeated_loses_to_clean():
    c = text_candidates(["the cat sat on a mat", "the cat the cat the cat"])
    s = build_scorer("repetition", n=4).score(c, CTX)
    assert s[1] < s[0] == 0.0


# ---------------------------------------------------------------------- compliance
def test_compliance_banned_phrase_loses():
    c = text_candidates(["a quiet laptop", "the cheapest laptop", "The Cheapest laptop, guaranteed"])
    s = build_scorer("compliance").score(c, CTX)
    assert s.tolist() == pytest.approx([0.0, -0.5, -0.75])


def test_compliance_miscopied_number_loses():
    c = text_candidates(["a 256GB SSD", "a 265GB SSD", "a 257GB SSD", "a 512GB SSD", "a 2566GB SSD"],
                        prompt="256GB SSD laptop")
    s = build_scorer("compliance", banned=[]).score(c, CTX)
    # permutation and one-digit edit are near misses; another number (512) and another length are not
    assert s.tolist() == pytest.approx([0.0, -0.5, -0.5, 0.0, 0.0])


def test_compliance_numbers_from_meta_and_off():
    c = text_candidates(["costs 19.99", "costs 19.09"], prompt="price?")
    ctx = ScoringContext(tokenizer=TOK, meta={"copy_numbers": ["$19.99"]})
    assert build_scorer("compliance", numbers="meta").score(c, ctx).tolist() == pytest.approx([0.0, -0.5])
    assert build_scorer("compliance", numbers="prompt").score(c, ctx).tolist() == [0.0, 0.0]  # prompt has none
    assert build_scorer("compliance", numbers="off").score(c, ctx).tolist() == [0.0, 0.0]


def test_compliance_patterns_lexicon_string_and_cjk():
    sc = build_scorer("compliance", banned="最便宜|number one", patterns=[r"guarantee[ds]?"])
    kinds = [v.text for v in sc.violations("这是最便宜的 and number one, guaranteed")]
    assert kinds == ["最便宜", "number one", "guaranteed"]
    assert sc.violations("the bestow") == []  # ASCII phrases match whole words only
    with pytest.raises(ParameterError, match="patterns"):
        build_scorer("compliance", patterns=["("])
    with pytest.raises(ParameterError, match="banned"):
        build_scorer("compliance", banned=[1, 2])


# ---------------------------------------------------------------------- consistency
def test_consistency_hashing_prefers_overlapping_text():
    c = text_candidates(["a fast laptop with a big SSD", "rainy weather in paris"], prompt="fast laptop SSD")
    s = build_scorer("consistency", model="hashing").score(c, CTX)
    assert s[0] > s[1]
    assert ((-1 <= s) & (s <= 0)).all()


def test_consistency_real_minilm_prefers_on_topic_text():
    prompt = "Recommend a laptop with a fast SSD for programming."
    c = text_candidates(["This notebook has a quick solid state drive, great for coding.",
                         "The weather in Paris is rainy in November."], prompt=prompt)
    sc = build_scorer("consistency")
    s = sc.score(c, CTX)
    assert s[0] > s[1] + 0.1
    from adaptive_decoding.scorers.consistency import load_minilm

    assert load_minilm("cpu") is load_minilm("cpu")  # loaded once per process


# ---------------------------------------------------------------------- ar_logprob
class BigramLM(CausalLM):
    """A causal LM whose next-token distribution is a fixed bigram table (for exact checks)."""

    def __init__(self, table: torch.Tensor) -> None:
        v = table.shape[0]
        super().__init__(CausalConfig(vocab_size=v, pad_token_id=v - 3, mask_token_id=v - 1, eos_token_id=v - 2,
                                      max_len=64, d_model=8, n_layers=1, n_heads=1, d_ff=8))
        self.table = table

    def forward(self, input_ids, attention_mask=None):
        return self.table.log()[input_ids]


def test_ar_logprob_uses_the_causal_lm_on_prompt_plus_candidate():
    v = TOK.vocab_size
    table = torch.full((v, v), 1e-3)
    a, b, c = TOK.encode("abc")
    table[a, b] = 10.0  # after 'a' comes 'b'
    table[b, c] = 10.0
    table = table / table.sum(1, keepdim=True)
    lm = BigramLM(table)
    cands = Candidates(tokens=torch.tensor([[b, c], [c, b]]), prompt_ids=torch.tensor([[a], [a]]))
    s = build_scorer("ar_logprob").score(cands, ScoringContext(tokenizer=TOK, resources={"causal_lm": lm}))
    good = math.sqrt(table[a, b] * table[b, c]) - 1
    bad = math.sqrt(table[a, c] * table[c, b]) - 1
    assert s.tolist() == pytest.approx([good, bad], abs=1e-5)
    # an undecided position is fed as [MASK] and not scored
    half = Candidates(tokens=torch.tensor([[b, TOK.mask_token_id]]), prompt_ids=torch.tensor([[a]]),
                      decided=torch.tensor([[True, False]]))
    s2 = build_scorer("ar_logprob").score(half, ScoringContext(resources={"causal_lm": lm}))
    assert s2.tolist() == pytest.approx([float(table[a, b]) - 1], abs=1e-5)


def test_ar_logprob_without_a_model_says_what_to_give():
    with pytest.raises(ValueError, match="causal LM"):
        build_scorer("ar_logprob").score(Candidates(tokens=torch.zeros(1, 2, dtype=torch.long)), ScoringContext())


# ---------------------------------------------------------------------- specs and the mixture
def test_parse_scorer_spec_builds_the_weighted_mixture():
    spec = "logprob:0.7,consistency(model=hashing):0.3,repetition(n=3):1"
    h = parse_scorer_spec(spec)
    assert h.display_name() == "mixture"
    assert type(build_scorer("hybrid", spec=spec)) is type(h)  # its earlier name, a registry alias
    comps = h.get_components()
    assert [(x["name"], x["weight"]) for x in comps] == [("logprob", 0.7), ("consistency", 0.3), ("repetition", 1.0)]
    assert comps[2]["params"]["n"] == 3
    c = text_candidates(["the cat the cat", "a fast SSD laptop"], prompt="fast SSD")
    c.logprobs = torch.full(c.tokens.shape, math.log(0.5))
    c.logprob_mask = c.decided.clone()
    parts = [build_scorer("logprob").score(c, CTX), build_scorer("consistency", model="hashing").score(c, CTX),
             build_scorer("repetition", n=3).score(c, CTX)]
    expected = 0.7 * parts[0] + 0.3 * parts[1] + 1.0 * parts[2]
    assert torch.allclose(h.score(c, CTX), expected, atol=1e-6)
    assert h.bounds() == pytest.approx((-2.0, 0.0))
    assert parse_scorer_spec("repetition").display_name() == "repetition"  # a bare name: that scorer
    for name in ("mixture", "hybrid", "weighted"):  # a scorer built from a spec is never a component of one
        with pytest.raises(ParameterError, match=f"'{name}' cannot be nested"):
            parse_components(f"logprob:1,{name}:1")


@pytest.mark.parametrize("spec, match", [
    ("logprob:abc", "'abc' of 'logprob' is not a number"),
    ("logprob:-1", "out of range"),
    ("logprob:nan", "out of range"),
    ("logprob:0.5,:1", "malformed"),
    ("", "empty"),
])
def test_parse_scorer_spec_bad_weights_fail_clearly(spec, match):
    with pytest.raises(ParameterError, match=match):
        parse_scorer_spec(spec)


def test_parse_scorer_spec_unknown_name_lists_known_scorers():
    with pytest.raises(UnknownNameError) as exc:
        parse_components("logprob:1,logprobz:1")
    msg = str(exc.value)
    assert "logprobz" in msg and "repetition" in msg and "consistency" in msg and "did you mean 'logprob'" in msg


def test_registry_has_every_builtin_and_entry_point_group():
    assert {"logprob", "ar_logprob", "consistency", "repetition", "compliance", "mixture"} <= set(SCORERS.names())
    assert SCORERS.entry_point_group == "adaptive_decoding.scorers"
    with pytest.raises(ParameterError, match="repetition.n=0 is out of range"):
        build_scorer("repetition", n=0)


def test_scorer_clamps_and_cleans_bad_outputs():
    from adaptive_decoding.framework.engine.scorer import Scorer

    class Wild(Scorer):
        """returns out-of-range and NaN values"""

        params: dict = {}

        def _score(self, c, ctx):
            return torch.tensor([float("nan"), 5.0, -7.0, -0.25])

    s = Wild().score(Candidates(tokens=torch.zeros(4, 1, dtype=torch.long)))
    assert s.tolist() == [-1.0, 0.0, -1.0, -0.25]


def test_train_causal_lm_saves_a_verifier_that_prefers_coherent_pairs(tmp_path, monkeypatch):
    import shutil

    from adaptive_decoding.framework.models.saved import CheckpointError
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training import causal_lm

    res = causal_lm.train_causal_lm("pairs", max_steps=80, out_dir=tmp_path / "lm", wandb_mode="disabled",
                                    progress=False, val_size=32, n_test=0, val_every=80, batch_size=64,
                                    d_model=32, n_layers=1, d_ff=64, lr=5e-3, warmup_steps=10)
    assert res.steps == 80 and (tmp_path / "lm" / "config.json").is_file()
    task = get_task("pairs")
    tok, g = task.tokenizer, task.gen_length

    def slot(text):
        ids = tok.encode(text)
        return ids + [tok.eos_token_id] * (g - len(ids))

    cands = Candidates(tokens=torch.tensor([slot("New York"), slot("New Francisco"), slot("San Francisco"),
                                            slot("San York")]), prompt_ids=torch.tensor([tok.encode("usa:")] * 4))
    # the cache: a missing verifier is named; a present one is loaded once per process
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(causal_lm, "_CACHE", {})
    with pytest.raises(CheckpointError, match="causal-pairs"):
        causal_lm.load_causal_lm("pairs", train_if_missing=False)
    shutil.copytree(tmp_path / "lm", causal_lm.causal_lm_dir("pairs"))
    lm = causal_lm.load_causal_lm("pairs", train_if_missing=False)
    assert causal_lm.load_causal_lm("pairs") is lm
    s = build_scorer("ar_logprob", task="pairs").score(cands, ScoringContext(tokenizer=tok))
    assert s[0] > s[1] and s[2] > s[3]  # "New York" > "New Francisco", "San Francisco" > "San York"
