"""The shared vocabulary and the built-in tasks: round trips, splits, exact scorers."""

from __future__ import annotations

import pytest

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.models.protocol import Tokenizer
from adaptive_decoding.framework.tasks.base import SPLITS, TASKS, Example, get_task
from adaptive_decoding.framework.tasks.pairs import PAIR_GROUPS
from adaptive_decoding.framework.tasks.sudoku import sudoku_completions, sudoku_solutions, sudoku_valid
from adaptive_decoding.framework.tasks.vocab import TaskTokenizer, get_tokenizer

BUILTIN = ("addition", "sorting", "sudoku", "pairs")


# ---------------------------------------------------------------------- tokenizer
def test_tokenizer_protocol_and_ids():
    tok = TaskTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.pad_token_id, tok.mask_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.vocab_size == len(set(tok.vocab))


def test_encode_digits_symbols_words_one_token_each():
    tok = get_tokenizer()
    ids = tok.encode("12+3=")
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "+", "3", "="]
    assert tok.convert_ids_to_tokens(tok.encode("New York,San Francisco")) == [
        "New", "York", ",", "San", "Francisco"]
    assert tok.encode("1 2") == tok.encode("12")  # whitespace only separates


@pytest.mark.parametrize("text", ["579", "New York,Hong Kong", "sort:0123=", "1.34|....|2...|1...=",
                                  "12+_4", "usa,asia:"])
def test_round_trip(text):
    tok = get_tokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_round_trip_every_id_without_eos_stop():
    tok = get_tokenizer()
    ids = list(range(tok.vocab_size)) + [tok.eos_token_id, 5, tok.pad_token_id, tok.mask_token_id]
    assert tok.encode(tok.decode(ids, stop_at_eos=False)) == ids


def test_decode_stops_at_eos_and_shows_mask():
    tok = get_tokenizer()
    ids = tok.encode("57") + [tok.mask_token_id, tok.eos_token_id] + tok.encode("9")
    assert tok.decode(ids) == "57_"
    assert tok.decode(ids, stop_at_eos=False) == "57_[EOS]9"


def test_unknown_character_and_word_errors_name_position():
    tok = get_tokenizer()
    with pytest.raises(ValueError, match=r"'\*' at position 2"):
        tok.encode("12*3")
    with pytest.raises(ValueError, match=r"'Paris' at position 4"):
        tok.encode("usa:Paris")
    with pytest.raises(ValueError, match=r"outside the vocabulary"):
        tok.decode([tok.vocab_size])


# ---------------------------------------------------------------------- splits
@pytest.mark.parametrize("name", BUILTIN)
def test_splits_disjoint_deterministic_and_fit(name):
    task = get_task(name)
    tok = task.tokenizer
    sets = {s: task.examples(s, 120, seed=3) for s in SPLITS}
    prompts = {s: {e.prompt for e in exs} for s, exs in sets.items()}
    assert not prompts["train"] & prompts["validation"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["validation"] & prompts["test"]
    assert task.examples("test", 120, seed=3) == sets["test"]
    assert task.examples("test", 120, seed=4) != sets["test"]
    for ex in sets["test"]:
        assert task.split_of(ex.prompt) == "test"
        n = len(tok.encode(ex.prompt))
        assert n <= task.max_prompt_length and n + task.gen_length <= 48
        target = task.target_ids(ex)
        assert len(target) == task.gen_length
        assert tok.decode(target) == ex.answer
        assert task.score(ex, ex.answer) == 1.0
    assert len({e.id for e in sets["test"]}) == 120  # distinct


def test_unknown_split_and_task():
    task = get_task("addition")
    with pytest.raises(ValueError, match="unknown split 'dev'.*train, validation, test"):
        task.examples("dev", 3)
    with pytest.raises(UnknownNameError, match="addition"):
        get_task("multiplication")
    with pytest.raises(ParameterError, match="digits"):
        get_task("addition", digits=0)
    assert set(BUILTIN) <= set(TASKS.names())


def test_answers_padded_with_eos_to_gen_length():
    task = get_task("addition")
    plain = get_task("addition", zero_pad=False)
    eos = task.tokenizer.eos_token_id
    ex = Example(id="x", prompt="100+200=", answer="300")
    assert plain.target_ids(ex)[-2:] == [eos, eos] and plain.target_ids(ex).count(eos) == 2
    ex4 = Example(id="y", prompt="999+999=", answer="1998")
    assert plain.target_ids(ex4).count(eos) == 1 and len(plain.target_ids(ex4)) == 5
    with pytest.raises(ValueError, match="more than gen_length=5"):
        plain.target_ids(Example(id="z", prompt="1+1=", answer="123456"))


# ---------------------------------------------------------------------- scorers
def test_addition_exact():
    task = get_task("addition")
    for ex in task.examples("test", 50):
        a, b = ex.meta["a"], ex.meta["b"]
        assert ex.prompt == f"{a}+{b}=" and ex.answer == str(a + b).zfill(4)
        assert task.score(ex, str(a + b).zfill(4)) == 1.0
        assert task.score(ex, str(a + b + 10).zfill(4)) == 0.0  # one digit off
        assert task.score(ex, str(a + b).zfill(4) + "0") == 0.0
    plain = get_task("addition", zero_pad=False)
    ex = plain.examples("test", 1)[0]
    assert ex.answer == str(ex.meta["a"] + ex.meta["b"])


def test_addition_carry_example_scores_the_classic_error_zero():
    task = get_task("addition")
    ex = Example(id="c", prompt="128+128=", answer="0256")
    assert task.score(ex, "0265") == 0.0 and task.score(ex, "0256") == 1.0


def test_sorting_exact():
    task = get_task("sorting")
    ex = Example(id="s", prompt="sort:53813=", answer="13358")
    assert task.score(ex, "13358") == 1.0
    assert task.score(ex, "13359") == 0.0
    assert task.score(ex, "1335") == 0.0
    for ex in task.examples("validation", 30):
        digits = ex.prompt[len("sort:"):-1]
        assert ex.answer == "".join(sorted(digits))


def test_sudoku_solutions_and_uniqueness():
    sols = sudoku_solutions()
    assert len(sols) == 288 and len(set(sols)) == 288
    assert all(sudoku_valid(list(s)) for s in sols)
    task = get_task("sudoku")
    for ex in task.examples("test", 30):
        assert len(sudoku_completions(ex.meta["givens"])) == 1
        assert 1 <= len(ex.meta["blanks"]) <= task.max_blanks
        assert ex.prompt.count(".") == len(ex.meta["blanks"])
        assert ex.answer == "".join(map(str, sudoku_completions(ex.meta["givens"])[0]))


def test_sudoku_scorer_accepts_any_valid_completion():
    task = get_task("sudoku")
    # two rows blank: several completions exist
    sol = "1234341221434321"
    prompt = "1234|3412|....|....="
    ex = Example(id="u", prompt=prompt, answer=sol)
    completions = sudoku_completions(task.parse_givens(prompt))
    assert len(completions) >= 2
    other = "".join(map(str, next(c for c in completions if "".join(map(str, c)) != sol)))
    assert task.score(ex, other) == 1.0
    assert task.score(ex, sol) == 1.0
    bad = sol[:-2] + sol[-1] + sol[-2]  # swap two cells: invalid
    assert task.score(ex, bad) == 0.0
    inconsistent = "2134" + sol[4:]  # changes a given
    assert task.score(ex, inconsistent) == 0.0
    assert task.score(ex, sol[:15]) == 0.0


def test_pairs_scorer_and_joint_coherence():
    task = get_task("pairs")
    ex = Example(id="p", prompt="usa,asia:", answer="New York,Hong Kong", meta={"groups": ["usa", "asia"]})
    assert task.score(ex, "San Francisco,New Delhi") == 1.0  # any valid pair per slot
    assert task.score(ex, "New Francisco,Hong Kong") == 0.0
    c = task.joint_coherence(ex, "New Francisco,Hong Lumpur")
    assert c == {"slots": 2, "valid": 0, "incoherent": 2, "other": 0, "extra": 0}
    c = task.joint_coherence(ex, "New York,Las Vegas,Tel Aviv")
    assert c == {"slots": 2, "valid": 1, "incoherent": 0, "other": 1, "extra": 1}
    assert task.score(ex, "New York,Hong Kong,Hong Kong") == 0.0


def test_pairs_prompt_does_not_determine_the_answer():
    task = get_task("pairs")
    exs = task.examples("train", 400, seed=1)
    by_prompt: dict[str, set[str]] = {}
    for ex in exs:
        by_prompt.setdefault(ex.prompt, set()).add(ex.answer)
    assert max(len(v) for v in by_prompt.values()) >= 3
    for group, phrases in PAIR_GROUPS.items():
        assert len({p[0] for p in phrases}) == len({p[1] for p in phrases}) == len(phrases)
