"""Docs stay true: the generated plugin reference matches the registry, the README's commands exist."""

from __future__ import annotations

from pathlib import Path

from adaptive_decoding.framework.cli.listing import markdown
from adaptive_decoding.framework.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_controllers_reference_is_current():
    current = (ROOT / "docs" / "controllers.md").read_text()
    assert current == markdown(["controllers", "scorers", "options"]), (
        "docs/controllers.md is stale: run `adec list --markdown > docs/controllers.md`")


def test_list_options_explains_every_loop_and_lookahead_option(capsys):
    from adaptive_decoding.framework.cli.main import main
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.lookahead import Lookahead

    assert main(["list", "options", "--verbose"]) == 0
    out = capsys.readouterr().out
    for name, spec in [*DecodeConfig.params.items(), *Lookahead.params.items()]:
        assert f"      {name} " in out and spec.doc in out, name
    # a '|' inside a cell is escaped, so the Markdown tables keep their columns
    table = [line for line in markdown(["options"]).splitlines() if line.startswith("| `cache`")][0]
    assert table.count(" | ") == 4 and "none \\| prefix" in table


def test_readme_commands_are_real_subcommands():
    readme = (ROOT / "README.md").read_text()
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for line in readme.splitlines():
        if line.startswith("| `adec "):
            assert line.split()[2] in subs, line
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
    assert readme.count("```bash") >= 2


def test_extending_examples_run_and_conform():
    """The two examples in docs/extending.md are real plugins that pass the conformance suites."""
    import re

    from adaptive_decoding.framework.engine.controller import CONTROLLERS
    from adaptive_decoding.framework.engine.scorer import SCORERS
    from adaptive_decoding.framework.testing.conformance import check_controller
    from adaptive_decoding.framework.testing.scorer_conformance import check_scorer

    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    try:
        exec(compile(blocks[0], "extending-controller", "exec"), {"__name__": "docs_example_controller"})
        exec(compile(blocks[1], "extending-scorer", "exec"), {"__name__": "docs_example_scorer"})
        check_controller("entropy_floor")
        check_scorer("short")
    finally:
        CONTROLLERS._table.pop("entropy_floor", None)
        SCORERS._table.pop("short", None)


def test_the_nesting_example_runs_keeps_its_child_memory_prefixed_and_conforms():
    """docs/extending.md's wrapper is a Composite like any: its child's memory under "capped/inner/",
    tuned together with it, and it passes the conformance suite (``implements`` included)."""
    import re

    import torch

    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller import CONTROLLERS, DecodeState
    from adaptive_decoding.framework.testing.conformance import check_controller
    from adaptive_decoding.framework.tuning.space import tuned_space

    section = (ROOT / "docs" / "extending.md").read_text().split("## A controller built from others", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    assert len(block) == 1
    try:
        exec(compile(block[0], "extending-nesting", "exec"), {"__name__": "docs_example_nesting"})
        capped = CONTROLLERS.get("capped").build(inner="margin_topk", inner_params={"adapt": True})
        state = DecodeState(config=DecodeConfig(gen_length=4), seeds=torch.zeros(2, dtype=torch.long), mask_token_id=15)
        capped.reset(state)
        assert set(state.memory) == {"capped/inner/margin_topk.eta"}
        assert set(tuned_space(CONTROLLERS.get("capped"))) == {"k_max", "inner.threshold"}
        check_controller("capped")
    finally:
        CONTROLLERS._table.pop("capped", None)


def test_doc_examples_import_only_the_public_api():
    """Every Python example of docs/ and the README imports from ``adaptive_decoding.framework`` or
    ``adaptive_decoding.experiments`` themselves (their ``__all__``), never from a module inside them:
    the public API is what the docs show."""
    import re

    import adaptive_decoding.experiments as experiments
    import adaptive_decoding.framework as framework

    public = {"framework": set(framework.__all__), "experiments": set(experiments.__all__)}
    deep, unknown = [], []
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S):
            for line in block.splitlines():
                if re.match(r"\s*(from|import) (adaptive_decoding\.)?(framework|controllers|scorers|experiments)\.", line):
                    deep.append(f"{path.name}: {line.strip()}")
                if m := re.match(r"\s*from adaptive_decoding\.(framework|experiments) import (.*)", line):
                    unknown += [f"{path.name}: {n}" for n in re.split(r"[,\s()]+", m.group(2))
                                if n and n not in public[m.group(1)]]
    assert deep == [] and unknown == []
