import os
import tempfile

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# remote-code test fixtures are copied into this folder instead of the user's HF cache
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="adec-hf-modules-"))


def _load_real_format() -> None:
    """The checkpoint builders of tests/fixtures/real_format (``build.py``, ``families.py``: configs in the
    real on-disk formats, tiny weights, the published reference networks) as the modules
    ``_adec_real_format_build`` and ``_adec_real_format_families``, loaded once before any test module,
    so a test imports them by those names."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parent / "fixtures" / "real_format"
    for name in ("build", "families"):
        module = f"_adec_real_format_{name}"
        if module not in sys.modules:
            spec = importlib.util.spec_from_file_location(module, folder / f"{name}.py")
            sys.modules[module] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[module])


_load_real_format()


@pytest.fixture(scope="module")
def tiny_llada2(tmp_path_factory):
    """A builder of (the framework's denoiser, the published reference network) for one tiny LLaDA2-MoE
    checkpoint in the real on-disk format, both heads multiplied by ``head_scale`` (a random tiny model is
    near uniform; a sharper head makes its decisions threshold-bound)."""
    import _adec_real_format_build as build  # loaded by _load_real_format above
    import torch

    from adaptive_decoding.framework.models.arch import load_architecture
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    def make(*, block_size: int, mask: int, eos: int, vocab: int, head_scale: float, seed: int = 3):
        folder = build.build_llada2(tmp_path_factory.mktemp("llada2") / "ckpt", seed=seed, block_size=block_size)
        own, ref = load_architecture(folder, dtype=torch.float32), build.reference_model(folder)
        with torch.no_grad():
            own.lm_head.weight.mul_(head_scale)
            ref.lm_head.weight.mul_(head_scale)
        return OwnArchitectureDenoiser(own, mask_token_id=mask, vocab_size=vocab, eos_token_id=eos), ref

    return make
