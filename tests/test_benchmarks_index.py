"""benchmarks/README.md is the folder's index: every script directly under benchmarks/ is named in it."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_readme_names_every_script() -> None:
    readme = (BENCHMARKS / "README.md").read_text()
    scripts = sorted(p.name for p in BENCHMARKS.iterdir() if p.is_file() and p.suffix in (".py", ".sh"))
    assert scripts, "no scripts found: the benchmarks folder moved?"
    missing = [name for name in scripts if f"`{name}`" not in readme]
    assert not missing, f"benchmarks/README.md does not name {missing}: add a line for each"


def test_notes_point_to_the_readme() -> None:
    assert "benchmarks/README.md" in (BENCHMARKS / "NOTES.md").read_text()[:500]
