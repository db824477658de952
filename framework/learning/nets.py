"""The policy networks: g(φ) per position (MLP, logistic regression) or over the whole window.

Every network maps a step's window of features ``x`` ``[N, W, F]`` (``valid`` ``[N, W]`` marks the
eligible positions) to logits ``[N, W]`` of p(safe | ·) = σ(logit). The per-position networks
ignore ``valid`` (a position sees only its own φ); the window transformer lets every eligible
position attend to every other one, so a decision can depend on whether a coupled position is
uncertain too. Inputs are standardised with the training mean μ and scale s of φ.

``residual=True`` makes either network a learned correction of the confidence rule:
logit p(safe) = logit(confidence) + g(·), with g's last layer zero at the start, so an untrained
residual policy at threshold τ is exactly Fast-dLLM's "commit where confidence > τ (else the most
confident)", and training (imitation, DAgger, RL) moves it only where the data says so.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from adaptive_decoding.framework.learning.features import FEATURE_NAMES

CONFIDENCE = FEATURE_NAMES.index("confidence")


class _Standardise(nn.Module):
    def __init__(self, n_features: int, residual: bool = False) -> None:
        super().__init__()
        self.residual = bool(residual)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("scale", torch.ones(n_features))

    def _zero_last(self, layer: nn.Linear) -> None:
        if self.residual:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def anchor(self, x: torch.Tensor) -> torch.Tensor | float:
        """logit(confidence) for a residual network, else 0."""
        if not self.residual:
            return 0.0
        c = x[..., CONFIDENCE].to(self.mean.dtype).clamp(1e-6, 1 - 1e-6)
        return torch.log(c) - torch.log1p(-c)

    def set_normalisation(self, X: torch.Tensor) -> None:
        """μ and s from training rows ``X`` ``[N, F]`` (or windows ``[N, W, F]`` with ``valid``)."""
        X = X.reshape(-1, X.shape[-1])
        self.mean.copy_(X.mean(0))
        self.scale.copy_(X.std(0).clamp(min=1e-6) if len(X) > 1 else torch.ones_like(self.scale))

    def standardise(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.mean.dtype) - self.mean) / self.scale


class PolicyNet(_Standardise):
    """Per position: logits g((φ − μ)/s); ``hidden=()`` is logistic regression."""

    kind_of_input = "position"

    def __init__(self, n_features: int = len(FEATURE_NAMES), hidden: Sequence[int] = (32, 32),
                 residual: bool = False) -> None:
        super().__init__(n_features, residual)
        self.hidden = tuple(int(h) for h in hidden)
        layers: list[nn.Module] = []
        d = n_features
        for h in self.hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self._zero_last(layers[-1])
        self.net = nn.Sequential(*layers)

    def arch(self) -> dict:
        return {"hidden": list(self.hidden), **({"residual": True} if self.residual else {})}

    def forward(self, x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.net(self.standardise(x)).squeeze(-1) + self.anchor(x)


class _Block(nn.Module):
    """Pre-norm self-attention over the eligible positions, then a ReLU feed-forward."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, h: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        n, w, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(n, w, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
        h = h + self.out((att @ v).transpose(1, 2).reshape(n, w, d))
        return h + self.ff(self.norm2(h))


class WindowPolicyNet(_Standardise):
    """A small transformer over the window: every eligible position attends to the eligible ones.

    ``layers`` blocks of width ``d_model`` with ``heads`` heads; no positional encoding beyond φ's
    own position features, so the decision is the same whatever order the window is listed in.
    """

    kind_of_input = "window"

    def __init__(self, n_features: int = len(FEATURE_NAMES), d_model: int = 32, layers: int = 2,
                 heads: int = 4, residual: bool = False) -> None:
        super().__init__(n_features, residual)
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be a multiple of heads={heads}")
        self.d_model, self.n_layers, self.heads = int(d_model), int(layers), int(heads)
        self.embed = nn.Linear(n_features, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 1))
        self._zero_last(self.head[1])

    def arch(self) -> dict:
        return {"d_model": self.d_model, "layers": self.n_layers, "heads": self.heads,
                **({"residual": True} if self.residual else {})}

    def forward(self, x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        squeeze = x.dim() == 2  # a single window [W, F]
        if squeeze:
            x = x[None]
            valid = None if valid is None else valid[None]
        n, w, _ = x.shape
        valid = torch.ones(n, w, dtype=torch.bool, device=x.device) if valid is None else valid.bool()
        eye = torch.eye(w, dtype=torch.bool, device=x.device)
        allowed = valid[:, None, :] | eye[None]  # [N, Wq, Wk]; a padding slot attends to itself only
        h = self.embed(self.standardise(x))
        for block in self.blocks:
            h = block(h, allowed)
        out = self.head(h).squeeze(-1) + self.anchor(x)
        return out[0] if squeeze else out


KINDS = ("mlp", "logreg", "transformer")
#: the registered controller that decodes each policy kind
CONTROLLER_OF = {"mlp": "learned", "logreg": "logreg", "transformer": "learned_window"}


def build_net(kind: str, arch: Optional[dict] = None, n_features: int = len(FEATURE_NAMES)) -> nn.Module:
    """The network of a policy ``kind`` with its architecture (a file header's ``arch``)."""
    arch = dict(arch or {})
    if kind == "transformer":
        return WindowPolicyNet(n_features, **arch)
    if kind == "logreg":
        return PolicyNet(n_features, ())
    if kind == "mlp":
        return PolicyNet(n_features, arch.get("hidden", (32, 32)), bool(arch.get("residual", False)))
    raise ValueError(f"policy kind {kind!r}; allowed: {', '.join(KINDS)}")
