"""Fixtures for the own-architecture tests: tiny checkpoint folders in the real on-disk format
(written by ``tests/fixtures/real_format/build.py``) and the reference remote-code models."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REAL_FORMAT = Path(__file__).resolve().parents[2] / "fixtures" / "real_format"


def _load_build():
    name = "_adec_real_format_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REAL_FORMAT / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def build():
    """The fixture builder module (``build_llada``, ``build_dream``, ``reference_model`` ...)."""
    return _load_build()


# name -> (builder, kwargs); GQA and sharding vary so that every layout is exercised somewhere
CHECKPOINTS = {
    "llada": ("build_llada", dict(seed=1)),
    "llada_gqa_sharded": ("build_llada", dict(seed=2, n_kv_heads=2, shards=3)),
    "dream": ("build_dream", dict(seed=3)),  # GQA: 4 heads, 2 kv heads
    "dream_mha_sharded": ("build_dream", dict(seed=4, num_key_value_heads=4, shards=2)),
    "llada2": ("build_llada2", dict(seed=5)),  # sharded: 3 safetensors + index
}


@pytest.fixture(scope="session")
def checkpoint(build, tmp_path_factory):
    """``checkpoint(name)`` -> folder of a built checkpoint (built once per session)."""
    made = {}

    def get(name):
        if name not in made:
            fn, kwargs = CHECKPOINTS[name]
            made[name] = getattr(build, fn)(tmp_path_factory.mktemp(name) / "ckpt", **kwargs)
        return made[name]

    return get


@pytest.fixture(scope="session")
def reference(build, checkpoint):
    """``reference(name)`` -> the remote-code model of that checkpoint, float32, eval mode."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = build.reference_model(checkpoint(name))
        return made[name]

    return get


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """These models are tiny: one intra-op thread is fastest and avoids spinning threads on a busy
    2-core machine (restored afterwards for the rest of the suite)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
