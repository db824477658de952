"""The registry's three errors, lazy and entry-point plugins, and parameter validation."""

from __future__ import annotations

from importlib import metadata

import pytest

from adaptive_decoding.framework.core.params import (
    Param,
    ParameterError,
    coerce_literal,
    parse_assignments,
)
from adaptive_decoding.framework.core.registry import Registry, RegistryError, UnknownNameError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller
from adaptive_decoding.framework.engine.controller_io import build_controller


class Base:
    pass


class Good(Base):
    pass


class Other:
    pass


def test_duplicate_wrong_type_and_unknown_errors():
    reg = Registry("widget", base=Base)
    reg.add("good", Good, aliases=("g",))
    with pytest.raises(RegistryError, match="widget name 'good' is already registered"):
        reg.add("good", type("Good2", (Base,), {}))
    with pytest.raises(TypeError, match="is not a subclass of"):
        reg.add("other", Other)
    with pytest.raises(UnknownNameError, match=r"unknown widget 'godo'; did you mean 'good'\? Known widgets: good"):
        reg.get("godo")
    assert reg.get("g") is Good


def test_lazy_string_entries_import_on_first_use():
    reg = Registry("controller", base=Controller)
    reg.add("seq", "adaptive_decoding.controllers.baselines:Sequential")
    assert reg.get("seq").__name__ == "Sequential"
    reg.add("bad", "adaptive_decoding.controllers.baselines:Sequential.nope")
    with pytest.raises(AttributeError):
        reg.get("bad")


def test_entry_point_plugins_are_found(monkeypatch):
    ep = metadata.EntryPoint(name="their_ctrl", value="adaptive_decoding.controllers.baselines:FastDLLM",
                             group="adaptive_decoding.controllers")

    def fake_entry_points(group=None, **kw):
        return [ep] if group == "adaptive_decoding.controllers" else []

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    reg = Registry("controller", base=Controller, entry_point_group="adaptive_decoding.controllers",
                   builtin_modules=("adaptive_decoding.controllers",))
    assert "their_ctrl" in reg.names()
    assert reg.get("their_ctrl")(threshold=0.5).threshold == 0.5


def test_builtins_registered_with_kinds():
    names = CONTROLLERS.names()
    for n in ("sequential", "llada", "llada_random", "dream_confidence", "dream_margin", "dream_entropy",
              "fast_dllm", "eb"):
        assert n in names
    assert CONTROLLERS.get("fast_dllm").kind == "baseline"
    assert CONTROLLERS.get("sequential").kind == "reference"


def test_param_messages_name_parameter_value_and_range():
    p = Param(float, low=0.0, high=1.0)
    with pytest.raises(ParameterError, match=r"^m\.eta=1.5 is out of range; allowed: number in \[0, 1\]$"):
        p.check("m", "eta", 1.5)
    with pytest.raises(ParameterError, match=r"k=0 is out of range; allowed: integer in \[1, inf\)"):
        Param(int, low=1).check("", "k", 0)
    with pytest.raises(ParameterError, match=r"k=2.5 is not an integer"):
        Param(int, low=1).check("", "k", 2.5)
    with pytest.raises(ParameterError, match="one of 'a', 'b'"):
        Param(str, choices=("a", "b")).check("", "mode", "c")
    assert Param(int, low=1).check("", "k", "3") == 3


def test_unknown_parameter_lists_known_ones():
    with pytest.raises(ParameterError, match="fast_dllm has no parameter 'treshold'; known: threshold"):
        build_controller("fast_dllm", treshold=0.5)


def test_get_params_round_trip():
    c = build_controller("llada", steps=16, remasking="random")
    assert c.get_params() == {"steps": 16, "remasking": "random", "confidence_eos_inf": False}
    assert type(c)(**c.get_params()) == c


def test_set_literals():
    assert parse_assignments(["a=1", "b=0.5", "c=true", "d=null", "e=text", "f=[1, 2]"]) == {
        "a": 1, "b": 0.5, "c": True, "d": None, "e": "text", "f": [1, 2]}
    assert coerce_literal("1e-3") == 1e-3
    with pytest.raises(ParameterError, match="--set expects key=value"):
        parse_assignments(["novalue"])
    assert coerce_literal("{name: margin_topk, params: {eta: 0.95}}") == {"name": "margin_topk",
                                                                         "params": {"eta": 0.95}}
    with pytest.raises(ParameterError, match="not a valid YAML list or mapping"):
        coerce_literal("{name: [unclosed}")


def test_none_typed_on_the_command_line_is_the_choice_none_where_there_is_one():
    # `--set cache=none` and `--lookahead rescore=none` read as null; both were refused before
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.lookahead import Lookahead

    sets = parse_assignments(["cache=none"])
    assert sets == {"cache": None} and DecodeConfig.build(**sets).cache == "none"
    assert Lookahead.build(**parse_assignments(["rescore=none"])).rescore == "none"
    with pytest.raises(ParameterError, match="branch=None is not allowed"):
        Lookahead.build(branch=None)  # no 'none' among its choices


# ---------------------------------------------------------------------- loud plugin loading
def _broken_module(tmp_path, monkeypatch, name="adec_broken_plugin"):
    (tmp_path / f"{name}.py").write_text("import numpy\nraise RuntimeError('typo in the plugin')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_broken_builtin_module_is_an_error_naming_it(tmp_path, monkeypatch):
    from adaptive_decoding.framework.core.registry import PluginImportError, Registry

    mod = _broken_module(tmp_path, monkeypatch)
    reg = Registry("widget", builtin_modules=(mod,))
    with pytest.raises(PluginImportError, match=rf"built-in widget module '{mod}'.*RuntimeError: typo in the plugin"):
        reg.names()


def test_a_broken_entry_point_is_an_error_naming_it(tmp_path, monkeypatch):
    from importlib import metadata

    from adaptive_decoding.framework.core import registry as registry_mod
    from adaptive_decoding.framework.core.registry import PluginImportError, Registry

    mod = _broken_module(tmp_path, monkeypatch, "adec_broken_ep")
    ep = metadata.EntryPoint(name="theirs", value=f"{mod}:Thing", group="adec.test.widgets")
    monkeypatch.setattr(registry_mod.metadata, "entry_points", lambda group=None: [ep] if group == ep.group else [])
    reg = Registry("widget", entry_point_group="adec.test.widgets")
    assert reg.names() == ["theirs"]  # listed lazily, imported when asked for
    with pytest.raises(PluginImportError, match=rf"widget 'theirs' \(entry point '{mod}:Thing'\).*typo in the plugin"):
        reg.get("theirs")
    with pytest.raises(PluginImportError):
        reg.items()


def test_skip_broken_plugins_warns_and_leaves_them_out(tmp_path, monkeypatch):
    from adaptive_decoding.framework.core.registry import Registry, skip_broken_plugins

    mod = _broken_module(tmp_path, monkeypatch, "adec_broken_skip")
    reg = Registry("widget", builtin_modules=(mod,))
    reg.register("fine")(type("Fine", (), {}))
    skip_broken_plugins(True)
    try:
        with pytest.warns(RuntimeWarning, match=rf"'{mod}' failed to import"):
            assert reg.names() == ["fine"]
    finally:
        skip_broken_plugins(False)


def test_cli_reports_a_broken_command_module_and_skips_it_on_request(monkeypatch, capsys):
    import importlib
    import sys as _sys

    from adaptive_decoding.framework.core.registry import PluginImportError

    cli_main = importlib.import_module("adaptive_decoding.framework.cli.main")

    monkeypatch.setattr(cli_main, "COMMAND_MODULES", cli_main.COMMAND_MODULES + ("no_such_command",))
    with pytest.raises(PluginImportError, match=r"command module 'adaptive_decoding.framework.cli.no_such_command'"):
        cli_main.main(["list", "controllers"])
    try:
        with pytest.warns(RuntimeWarning, match="no_such_command"):
            assert cli_main.main(["--skip-broken-plugins", "list", "tasks"]) == 0
    finally:
        from adaptive_decoding.framework.core.registry import skip_broken_plugins
        skip_broken_plugins(False)
    assert "sudoku9" in capsys.readouterr().out
    assert _sys.modules.get("adaptive_decoding.framework.cli.no_such_command") is None


# ---------------------------------------------------------------------- discovery, abstract bases, public names
def test_a_new_module_in_a_plugin_package_registers_itself_without_being_listed(tmp_path, monkeypatch):
    from adaptive_decoding.framework.core.registry import discover_plugins, package_modules

    pkg = tmp_path / "adec_found_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("")
    (pkg / "_private.py").write_text("raise RuntimeError('a private module is never imported')\n")
    (pkg / "widgets.py").write_text(
        "from adaptive_decoding.framework.core.registry import Registry\nREG = Registry('widget')\n"
        "REG.register('spinner')(type('Spinner', (), {}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_modules("adec_found_pkg") == ("helper", "widgets")
    assert package_modules("adec_found_pkg", skip=("helper",)) == ("widgets",)
    assert discover_plugins("adec_found_pkg", skip=("helper",)) == ("widgets",)
    import adec_found_pkg.widgets as widgets

    assert widgets.REG.names() == ["spinner"]
    with pytest.raises(RegistryError, match="'adec_found_pkg.widgets' is a module, not a package"):
        package_modules("adec_found_pkg.widgets")


def test_every_module_of_the_builtin_plugin_packages_is_imported():
    """Nothing lists the built-in modules: every file of controllers/, scorers/ and the metrics
    package (less its helpers) has been imported once its registry is read."""
    import sys

    from adaptive_decoding.framework.core.registry import package_modules
    from adaptive_decoding.framework.engine.scorer import SCORERS
    from adaptive_decoding.framework.tasks.metrics import HELPER_MODULES, METRICS

    CONTROLLERS.names(), SCORERS.names(), METRICS.names()
    for package, skip in (("adaptive_decoding.controllers", ()), ("adaptive_decoding.scorers", ()), ("adaptive_decoding.framework.tasks.metrics", HELPER_MODULES)):
        modules = package_modules(package, skip=skip)
        assert modules and all(f"{package}.{m}" in sys.modules for m in modules), package
    assert "jail" not in package_modules("adaptive_decoding.framework.tasks.metrics", skip=HELPER_MODULES)
    assert {"margin_topk", "oracle", "verified"} <= set(CONTROLLERS.names())
    assert {"logprob", "sudoku_rules"} <= set(SCORERS.names()) and {"exact", "gsm8k"} <= set(METRICS.names())


def test_a_controller_or_scorer_without_its_abstract_method_is_refused_at_registration():
    from adaptive_decoding.framework.engine.scorer import Scorer
    from adaptive_decoding.framework.tasks.metrics import Metric

    class NoDecide(Controller):
        """Forgot decide."""

    class NoScore(Scorer):
        """Forgot _score."""

    class NoMetricScore(Metric):
        """Forgot score."""

    for base, cls, missing in ((Controller, NoDecide, "decide"), (Scorer, NoScore, "_score"),
                               (Metric, NoMetricScore, "score")):
        reg = Registry("plugin", base=base)
        with pytest.raises(TypeError, match=rf"plugin 'x': .*{cls.__name__} does not implement {missing}, abstract in"):
            reg.add("x", cls)
        with pytest.raises(TypeError, match=missing):
            cls()


def test_param_names_is_public_and_the_old_private_name_still_works_with_a_warning():
    import inspect

    cls = CONTROLLERS.get("fast_dllm")
    assert cls.param_names() == [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert set(cls.param_names()) == set(cls.params)
    with pytest.warns(DeprecationWarning, match=r"_param_names\(\) is deprecated; call param_names\(\)"):
        assert cls._param_names() == cls.param_names()
