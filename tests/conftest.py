import os
import tempfile

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
