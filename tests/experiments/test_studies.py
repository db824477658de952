"""The one-off studies are in one place and all of them are listed (the package docstring and
docs/experiments.md), so that none is lost in a folder nobody reads."""

from __future__ import annotations

from pathlib import Path

import adaptive_decoding.experiments.studies

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "experiments" / "studies"


def test_every_study_is_listed():
    files = sorted(p.name for p in STUDIES.iterdir()
                   if p.suffix in (".py", ".sh") and p.name != "__init__.py")
    assert {"first_step_ceiling.py", "learned_table.py", "set_bound.py", "code_isolation.py"} <= set(files)
    doc = adaptive_decoding.experiments.studies.__doc__
    table = (ROOT / "docs" / "experiments.md").read_text().split("## One-off studies", 1)[1].split("\n## ", 1)[0]
    assert [f for f in files if f"``{f.removesuffix('.py')}``" not in doc] == []
    assert [f for f in files if f"| `{f}` |" not in table] == []
