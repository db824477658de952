"""Saving and loading controllers as YAML (the ``tuned:PATH`` format)."""

from __future__ import annotations

import pytest
import yaml

from adaptive_decoding.controllers.heuristic import Hybrid, MarginTopK
from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.controller_io import (
    build_controller,
    load_controller,
    load_decode_config,
    save_controller,
)


def test_save_writes_the_documented_yaml(tmp_path):
    path = save_controller(MarginTopK.build(eta=0.25, adapt=True), tmp_path / "sub" / "m.yaml",
                           decode_config=DecodeConfig(gen_length=16, block_length=8), extra={"trial": 7, "nfe": 5.5})
    doc = yaml.safe_load(path.read_text())
    assert list(doc) == ["controller", "params", "decode", "extra"]
    assert doc["controller"] == "margin_topk"
    assert doc["params"] == {"eta": 0.25, "k": 3, "adapt": True, "beta": 0.9, "depth": 1}
    assert doc["decode"]["gen_length"] == 16 and doc["decode"]["block_length"] == 8
    assert doc["extra"] == {"trial": 7, "nfe": 5.5}


def test_load_round_trip_overrides_and_tuned_prefix(tmp_path):
    h = Hybrid.build(warmup=2, margin={"adapt": True}, entropy={"buckets": (2, 4)})
    path = save_controller(h, tmp_path / "h.yaml")
    assert "buckets:\n    - 2" in path.read_text()  # tuples are written as plain lists
    loaded = load_controller(path)
    assert loaded == h and loaded.get_params()["entropy"] == {"buckets": [2, 4]}
    assert load_controller(path, warmup=5).warmup == 5
    via_cli = build_controller(f"tuned:{path}", warmup=1)
    assert isinstance(via_cli, Hybrid) and via_cli.warmup == 1 and via_cli.margin == {"adapt": True}
    assert load_decode_config(path) is None


def test_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_controller(missing)
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        build_controller(f"tuned:{missing}")


def test_a_saved_config_that_does_not_validate_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("controller: margin_topk\nparams: {eta: 2.0, k: 3}\n")
    with pytest.raises(ParameterError) as err:
        load_controller(path)
    msg = str(err.value)
    assert str(path) in msg and "margin_topk.eta=2.0" in msg and "number in [0, 1]" in msg
    with pytest.raises(ParameterError, match=r"bad.yaml.*has no parameter 'speed'"):
        path.write_text("controller: margin_topk\nparams: {speed: 2}\n")
        load_controller(path)
    with pytest.raises(ParameterError, match=r"bad.yaml.*unknown controller 'margn_topk'.*margin_topk"):
        path.write_text("controller: margn_topk\n")
        load_controller(path)
    with pytest.raises(ParameterError, match="unknown key 'parms'"):
        path.write_text("controller: margin_topk\nparms: {}\n")
        load_controller(path)
    with pytest.raises(ParameterError, match="expected a mapping"):
        path.write_text("- margin_topk\n")
        load_controller(path)


def test_decode_section_is_validated(tmp_path):
    path = save_controller(MarginTopK.build(), tmp_path / "m.yaml", decode_config={"gen_length": 8, "block_length": 4})
    assert load_decode_config(path) == DecodeConfig(gen_length=8, block_length=4).get_params()
    path.write_text("controller: margin_topk\ndecode: {gen_length: 8, block_length: 3}\n")
    with pytest.raises(ParameterError, match=r"m.yaml: saved decode config .*block_length=3 does not divide"):
        load_decode_config(path)


class Unregistered(Controller):
    """Not in the registry."""

    params = {"t": Param(float, low=0.0)}

    def __init__(self, t: float = 0.5) -> None:
        self.t = t

    def decide(self, f, state):  # pragma: no cover - never decodes
        return Decision(commit=f.eligible)


def test_saving_an_unregistered_controller_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="does not resolve to it in the controller registry"):
        save_controller(Unregistered(), tmp_path / "u.yaml")


def test_a_saved_controller_can_be_a_sub_controller(tmp_path):
    path = save_controller(MarginTopK.build(eta=0.2, k=5), tmp_path / "m.yaml")
    sw = build_controller("switch", controllers=[f"tuned:{path}", "entropy_topk"], at=[3])
    child = sw.children()["0"].controller
    assert isinstance(child, MarginTopK) and (child.eta, child.k) == (0.2, 5)
    assert load_controller(save_controller(sw, tmp_path / "sw.yaml")) == sw
