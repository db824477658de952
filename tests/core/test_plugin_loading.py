"""A plugin module or entry point that fails to import is an error naming it; ``--skip-broken-plugins``
makes it a warning."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from framework.core import registry as reg
from framework.core.registry import PluginImportError, Registry, UnknownNameError


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    (tmp_path / "adec_broken_plugin.py").write_text("import nonexistent_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(reg, "SKIP_BROKEN_PLUGINS", False)
    yield "adec_broken_plugin"
    sys.modules.pop("adec_broken_plugin", None)


def test_a_broken_builtin_module_raises_with_its_name(broken_module):
    widgets = Registry("widget", builtin_modules=(broken_module,))
    with pytest.raises(PluginImportError, match=r"built-in widget module 'adec_broken_plugin' failed to import: "
                                                r"ModuleNotFoundError: .*nonexistent_dependency_xyz"):
        widgets.names()


def test_a_broken_entry_point_raises_with_its_module(broken_module, monkeypatch):
    ep = SimpleNamespace(name="theirs", value=f"{broken_module}:Thing")
    monkeypatch.setattr(reg.metadata, "entry_points", lambda group=None: [ep])
    widgets = Registry("widget", entry_point_group="adaptive_decoding.widgets")
    with pytest.raises(PluginImportError, match=r"widget 'theirs'.*'adec_broken_plugin' failed to import"):
        widgets.get("theirs")


def test_skip_broken_plugins_downgrades_to_a_warning(broken_module, monkeypatch):
    reg.skip_broken_plugins(True)
    try:
        widgets = Registry("widget", builtin_modules=(broken_module,))
        with pytest.warns(UserWarning, match="'adec_broken_plugin' failed to import"):
            assert widgets.names() == []
        ep = SimpleNamespace(name="theirs", value=f"{broken_module}:Thing")
        monkeypatch.setattr(reg.metadata, "entry_points", lambda group=None: [ep])
        other = Registry("widget", entry_point_group="adaptive_decoding.widgets")
        with pytest.warns(UserWarning, match="failed to import"), pytest.raises(UnknownNameError, match="unavailable"):
            other.get("theirs")
    finally:
        reg.skip_broken_plugins(False)


def test_the_cli_names_a_broken_command_module_and_the_flag_skips_it(monkeypatch, capsys):
    import importlib

    cli = importlib.import_module("framework.cli.main")

    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "no_such_command_xyz"))
    try:
        assert cli.main(["list"]) == 2
        assert "adec command module 'framework.cli.no_such_command_xyz' failed to import" in capsys.readouterr().err
        reg.skip_broken_plugins(True)
        with pytest.warns(UserWarning, match="no_such_command_xyz"):
            parser = cli.build_parser()
        assert parser.parse_args(["--skip-broken-plugins"]).skip_broken_plugins
    finally:
        reg.skip_broken_plugins(False)
