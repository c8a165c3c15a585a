"""Writing an export safely: into a staging folder, then swapped in, never over the user's own files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from tuner.errors import TunerError


def os_error(exc: OSError, out: Path, stage: Optional[Path] = None) -> TunerError:
    """One line naming the path and the OS reason (a staged path is named by where it was going)."""
    path = str(exc.filename or out)
    if stage is not None:
        path = path.replace(str(stage), str(out), 1)
    where = "" if path == str(out) else f" ({path})"
    return TunerError(f"cannot write the export to {out}{where}: {exc.strerror or exc}")


def check_out(out: Path, force: bool, ours: list[str], earlier_export: bool) -> None:
    """Refuse an out folder whose export paths (`ours`) hold anything but an earlier export of this name."""
    try:
        if out.exists() and not out.is_dir():
            raise TunerError(f"{out} exists and is not a folder; pass a folder to --out")
        if not (out.is_dir() and any(out.iterdir())):
            return
        present = [n for n in ours if os.path.lexists(out / n)]
    except OSError as exc:
        raise os_error(exc, out) from None
    if not force:
        raise TunerError(f"{out} is not empty; pass --force to replace the earlier export there")
    if present and not earlier_export:  # --force replaces an export, never the user's own files
        raise TunerError(f"{out / present[0]} is not from an earlier tuner export; --force refuses to overwrite it "
                         f"(pick another --out or --name)")


def _swap_in(stage: Path, out: Path, backup: Path, names: list[str]) -> None:
    """Move the earlier export's `names` into `backup`, then the staged ones into `out`; undo all on failure."""
    moved: list[str] = []
    placed: list[str] = []
    try:
        for n in names:
            if os.path.lexists(out / n):
                os.replace(out / n, backup / n)
                moved.append(n)
        for n in names:
            if os.path.lexists(stage / n):
                os.replace(stage / n, out / n)
                placed.append(n)
    except OSError:
        for n in placed:  # best effort: put the earlier export back as it was
            with contextlib.suppress(OSError):
                os.replace(out / n, stage / n)
        for n in moved:
            with contextlib.suppress(OSError):
                os.replace(backup / n, out / n)
        raise


def write_staged(out: Path, names: list[str], write: Callable[[Path], list[Path]],
                 verify: Optional[Callable[[Path], None]] = None) -> list[Path]:
    """Run `write(stage)` in a temporary folder inside `out`, then `verify(stage)` (export --check measures the
    staged package), then swap its `names` in (same file system: renames).

    A failed (or interrupted) export or check leaves the earlier one in place and no half-written one;
    OSError -> one-line TunerError.
    """
    created = not out.exists()
    stage: Optional[Path] = None
    backup: Optional[Path] = None
    done = False
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".tuner-export-", dir=out))
        rel = [p.relative_to(stage) for p in write(stage)]
        if verify is not None:
            verify(stage)
        backup = Path(tempfile.mkdtemp(prefix=".tuner-previous-", dir=out))
        _swap_in(stage, out, backup, names)
        done = True
        return [out / r for r in rel]
    except OSError as exc:
        raise os_error(exc, out, stage) from None
    finally:
        for tmp in (stage, backup):
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        if created and not done:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty
