"""``pairs``: paired phrases with several valid joint modes (New York / San Francisco, never
"New Francisco").
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Optional, Sequence

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, Example, ModelVariant, Recipe, Task, fold_whitespace
from adaptive_decoding.framework.tasks.vocab import VOCAB

# ====================================================================== pairs
#: group word -> its three two-word phrases; within a group no first or second word repeats, so a
#: first word from one phrase and a second from another is always an incoherent ("New Francisco")
PAIR_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "usa": (("New", "York"), ("San", "Francisco"), ("Los", "Angeles")),
    "asia": (("Hong", "Kong"), ("New", "Delhi"), ("Kuala", "Lumpur")),
    "west": (("San", "Diego"), ("Las", "Vegas"), ("Santa", "Fe")),
    "south": (("New", "Orleans"), ("San", "Antonio"), ("El", "Paso")),
    "world": (("Buenos", "Aires"), ("Tel", "Aviv"), ("Cape", "Town")),
    "coast": (("San", "Jose"), ("Santa", "Cruz"), ("Long", "Beach")),
}


@TASKS.register("pairs", aliases=("paired_phrases",))
class PairsTask(Task):
    """Paired phrases: each prompt group admits three two-word phrases, right only as a pair."""

    metric = "every slot a valid pair"
    vocabulary = VOCAB
    recipe = Recipe(max_steps=1500)  # val 100 % from ~1000 steps
    model_name = "tiny-pairs"
    model_description = "paired phrases (New York / San Francisco), tiny Transformer"
    params = {
        "min_groups": Param(int, low=1, high=4, doc="fewest phrase slots per answer"),
        "max_groups": Param(int, low=1, high=4, doc="most phrase slots per answer"),
    }

    def __init__(self, min_groups: int = 1, max_groups: int = 4) -> None:
        self.min_groups = min_groups
        self.max_groups = max_groups

    def check_combination(self) -> None:
        if self.min_groups > self.max_groups:
            raise ParameterError(
                f"pairs.min_groups={self.min_groups} is larger than max_groups={self.max_groups}"
            )

    @property
    def gen_length(self) -> int:
        return 3 * self.max_groups - 1  # two words per slot, commas between

    @property
    def max_prompt_length(self) -> int:
        return 2 * self.max_groups  # group words, commas, ':'

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        k = rng.randint(self.min_groups, self.max_groups)
        groups = [rng.choice(sorted(PAIR_GROUPS)) for _ in range(k)]
        chosen = [rng.randrange(3) for _ in groups]
        answer = ",".join(" ".join(PAIR_GROUPS[g][c]) for g, c in zip(groups, chosen))
        return ",".join(groups) + ":", answer, {"groups": groups, "choices": chosen}

    @staticmethod
    def groups_of(example: Example) -> list[str]:
        return list(example.meta.get("groups") or example.prompt.rstrip(":").split(","))

    def span_mask(self, example: Example, gen_length: int) -> list[bool]:
        """The two word positions of each phrase slot (3s and 3s + 1 for the prompt's groups): one span per phrase."""
        probe = SimpleNamespace(prompt=example.prompt, meta=dict(getattr(example, "meta", None) or {}))
        slots = len(self.groups_of(probe))  # type: ignore[arg-type]
        return [i < 3 * slots and i % 3 != 2 for i in range(gen_length)]

    def _slots(self, output_text: str) -> list[tuple[str, ...]]:
        return [tuple(part.split()) for part in fold_whitespace(output_text).split(",")]

    def score(self, example: Example, output_text: str) -> float:
        """1.0 if the output has one valid phrase of its group per slot, in order."""
        c = self.joint_coherence(example, output_text)
        return float(c["valid"] == c["slots"] and c["extra"] == 0)

    def completable(self, example: Example, tokens: Sequence[int], committed: Sequence[bool]) -> Optional[bool]:
        """Every committed word fits a phrase of its slot's group, both words of a slot fit the same
        phrase, and every committed comma and the first ``[EOS]`` stand where they must (slot s holds
        generation positions 3s and 3s + 1, its comma 3s + 2; the first ``[EOS]`` follows the last)."""
        groups = self.groups_of(example)
        target, end = self.target_ids(example), 3 * len(groups) - 1
        words: dict[int, str] = {}
        for i in range(min(end + 1, len(tokens))):
            if not committed[i]:
                continue
            if i == end or i % 3 == 2:
                if int(tokens[i]) != target[i]:
                    return False
            else:
                words[i] = self.tokenizer.decode([int(tokens[i])], stop_at_eos=False)
        for s, group in enumerate(groups):
            first, second = words.get(3 * s), words.get(3 * s + 1)
            if not any(first in (None, a) and second in (None, b) for a, b in PAIR_GROUPS[group]):
                return False
        return True

    def joint_coherence(self, example: Example, output_text: str) -> dict[str, int]:
        """Counts over the answer's slots: ``valid`` phrases, ``incoherent`` mixes of two valid phrases
        (a first word of one phrase, the second of another: "New Francisco"), ``other`` wrong slots,
        ``extra`` slots beyond the prompt's groups."""
        groups = self.groups_of(example)
        slots = self._slots(output_text)
        valid = incoherent = other = 0
        for i, group in enumerate(groups):
            phrases = PAIR_GROUPS[group]
            got = slots[i] if i < len(slots) else ()
            if got in phrases:
                valid += 1
            elif len(got) == 2 and got[0] in {p[0] for p in phrases} and got[1] in {p[1] for p in phrases}:
                incoherent += 1
            else:
                other += 1
        return {"slots": len(groups), "valid": valid, "incoherent": incoherent, "other": other,
                "extra": max(0, len(slots) - len(groups))}


# ====================================================================== phrases (pairs at scale)
@TASKS.register("phrases", aliases=("pairs_long",))
class PhrasesTask(PairsTask):
    """Pairs at scale: up to 42 phrase slots in a 128-token answer, in blocks, ended by ``[EOS]``.

    The prompt has ``max_groups`` places: the groups, then ``.`` for unused places, then ``:`` (so the
    answer starts at the same column whatever the number of slots). The answer is one phrase per
    group, comma separated, padded with ``[EOS]`` to ``gen_length``: its length varies, so
    predicting the end changes how many forwards a decoder needs. Every slot has three valid joint
    modes; committing both words of a slot in one step risks "New Francisco".
    """

    # 171-token canvas, up to 42 slots: the words of a slot couple only after ~600 steps (loss 0.45 -> 0.2);
    # measured: 1,001 steps in 32 min on one thread, 100% of 300 test answers one token per step
    recipe = Recipe(max_minutes=30.0, max_steps=3000, batch_size=64, val_size=128, val_every=1000, n_test=300)
    model_name = "tiny-phrases"
    model_description = "pairs at scale: up to 42 phrase slots in 128 tokens"
    # tiny-phrases adapted to block diffusion (LLaDA2.x's layout: canvas blocks of 32, block-causal) by
    # fine-tuning with the two-copy objective, as Fast-dLLM v2 and SDAR adapt their models
    model_variants = (ModelVariant(
        "tiny-phrases-bd32", "tiny-phrases as a block-diffusion model (block-causal, blocks of 32)",
        block_size=32, init_from="tiny-phrases",
        recipe=(("max_steps", 400), ("max_minutes", 25.0), ("lr", 1e-3), ("warmup_steps", 20),
                ("val_every", 200))),)
    params = {
        "min_groups": Param(int, low=1, high=64, doc="fewest phrase slots per answer"),
        "max_groups": Param(int, low=1, high=64, doc="most phrase slots (prompt places)"),
        "length": Param(int, low=2, high=256, doc="answer slot length G in tokens (≥ 3·max_groups − 1)"),
    }

    def __init__(self, min_groups: int = 10, max_groups: int = 42, length: int = 128) -> None:
        super().__init__(min_groups=min_groups, max_groups=max_groups)
        self.length = length

    def check_combination(self) -> None:
        super().check_combination()
        if self.length < 3 * self.max_groups - 1:
            raise ParameterError(f"phrases.length={self.length} cannot hold max_groups={self.max_groups} "
                                 f"phrases; allowed: length ≥ {3 * self.max_groups - 1}")

    @property
    def gen_length(self) -> int:
        return self.length

    @property
    def default_block_length(self) -> int:
        return 32

    @property
    def max_prompt_length(self) -> int:
        return self.max_groups + 1

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        _, answer, meta = super()._sample(rng)
        places = meta["groups"] + ["."] * (self.max_groups - len(meta["groups"]))
        return " ".join(places) + ":", answer, meta

    @staticmethod
    def groups_of(example: Example) -> list[str]:
        return list(example.meta.get("groups") or [w for w in example.prompt.rstrip(":").split() if w != "."])
