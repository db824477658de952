"""Tokens per forward as the field counts it: answer tokens pooled over the set / forwards pooled."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.core.measure import (
    answer_length_before_stop,
    answer_lengths,
    first_stop,
    tokens_per_forward,
    tokens_per_forward_mean,
)


def test_two_samples_of_1_and_81_forwards_pool_differently_from_the_mean_of_ratios():
    # Two 81-token answers: one decoded in 1 forward, one in 81. The set cost 82 forwards for 162
    # tokens, 1.98 tokens per forward; the per-sample mean of G / NFE says (81 + 1) / 2 = 41.
    assert tokens_per_forward([81, 81], [1, 81]) == pytest.approx(162 / 82)
    assert tokens_per_forward_mean([81, 81], [1, 81]) == pytest.approx(41.0)
    # equal forwards: both figures are G / NFE
    assert tokens_per_forward([81, 81], [9, 9]) == tokens_per_forward_mean([81, 81], [9, 9]) == 9.0


def test_pooled_figure_counts_answer_tokens_not_the_padding():
    # answers of 10 and 30 tokens in a 64-position canvas, 5 and 15 forwards: 40 / 20 = 2
    assert tokens_per_forward(torch.tensor([10, 30]), torch.tensor([5, 15])) == 2.0
    assert tokens_per_forward([], []) == 0.0
    with pytest.raises(ValueError, match="2 answer-token counts for 3 NFE counts"):
        tokens_per_forward([1, 2], [1, 2, 3])


def test_answer_lengths_stop_at_and_include_the_first_end_of_text():
    eos, eot = 2, 7
    generated = torch.tensor([[5, 6, eos, eos, eos],    # 3: up to and including the first EOS
                              [5, 6, 5, 6, 5],          # no end: all G
                              [eot, eos, 5, 5, 5],      # any end id counts (end-of-turn)
                              [5, 5, 5, 5, eos]])
    assert answer_lengths(generated, (eos, eot)).tolist() == [3, 5, 1, 5]
    assert answer_lengths(generated, ()).tolist() == [5, 5, 5, 5]


def test_a_stop_string_ends_the_answer_before_it():
    words = {1: "The", 2: " answer", 3: " is", 4: " 7", 5: ".\n", 6: "Q", 7: ":", 8: " next"}
    decode = lambda ids: "".join(words[i] for i in ids)  # noqa: E731
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    # "Q:" begins at token 6: the five tokens before it are the answer
    assert first_stop(decode(ids), ["Q:"]) == len("The answer is 7.\n")
    assert answer_length_before_stop(ids, decode, ["Q:"], end_length=8) == 5
    # a token that straddles the stop counts ("is 7" stops inside " 7")
    assert answer_length_before_stop(ids, decode, ["7."], end_length=8) == 4
    # no stop in the text, or the end-of-text comes first: the end-of-text length stands
    assert answer_length_before_stop(ids, decode, ["Z"], end_length=8) == 8
    assert answer_length_before_stop(ids, decode, ["Q:"], end_length=3) == 3
