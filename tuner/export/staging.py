"""Writing an export safely: into a staging folder, then swapped in, never over the user's own files."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Optional

from tuner.errors import TunerError
from tuner.export.options import check_out_kind

# An export's temporary folders in --out: .tuner-export-<host>-<pid>-<random> (what it writes) and
# .tuner-previous-<host>-<pid>-<random> (the earlier export, while it is swapped out). The host and pid say
# whether the export that made one is still running: a killed export's are removed by the next one.
_STAGING = re.compile(r"\.tuner-(export|previous)-(?:(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-)?[A-Za-z0-9_]+")
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host"


def _first_copy_error(exc: shutil.Error) -> tuple[Optional[str], str]:
    """(path, reason) of the first file shutil.copytree failed on: its Error lists them all, repr'd as one
    huge line (a full disk fails every file)."""
    first = exc.args[0][0] if exc.args and isinstance(exc.args[0], list) and exc.args[0] else None
    if not (isinstance(first, tuple) and len(first) == 3):
        return None, str(exc)[:200]
    why = str(first[2])
    reason = re.sub(r"^\[Errno \d+\] ", "", why)  # "[Errno 28] No space left on device: '/path'" -> the reason
    reason = reason.split(": '", 1)[0] if ": '" in reason else reason
    return str(first[1]), reason


def os_error(exc: OSError, out: Path, stage: Optional[Path] = None) -> TunerError:
    """One line naming the path and the OS reason (a staged path is named by where it was going)."""
    if isinstance(exc, shutil.Error):
        filename, reason = _first_copy_error(exc)
    else:
        filename, reason = (str(exc.filename) if exc.filename else None), str(exc.strerror or exc)
    path = filename or str(out)
    if stage is not None:
        path = path.replace(str(stage), str(out), 1)
    where = "" if path == str(out) else f" ({path})"
    return TunerError(f"cannot write the export to {out}{where}: {reason}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as exc:  # EPERM: alive, another user's
        return exc.errno != errno.ESRCH
    return True


def clear_dead_staging(out: Path) -> list[str]:
    """Remove the temporary folders a killed export left in `out` (its pid, on this host, is dead), putting
    back any earlier export it had swapped out and not replaced; one note per folder removed. Those of a
    running export, of another host or of an older tuner (no pid in the name) are left to check_out."""
    notes: list[str] = []
    try:
        entries = sorted(out.iterdir()) if out.is_dir() else []
    except OSError:
        return notes  # check_out says why
    for path in entries:
        m = _STAGING.fullmatch(path.name)
        if not m or m["pid"] is None or m["host"] != _HOST or _pid_alive(int(m["pid"])):
            continue
        if m.group(1) == "previous" and path.is_dir():  # killed mid-swap: the earlier export is in here
            for moved in sorted(path.iterdir()):
                if not os.path.lexists(out / moved.name):
                    with contextlib.suppress(OSError):
                        os.replace(moved, out / moved.name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            notes.append(f"removed {path.name} from {out}: left by an export that was killed (pid {m['pid']})")
    return notes


def _staging_in(out: Path) -> Optional[str]:
    """Why `out` holds only another export's temporary folders (None: it holds something else too)."""
    names = [p.name for p in out.iterdir()]
    found = [m for m in map(_STAGING.fullmatch, names) if m]
    if not found or len(found) != len(names):
        return None
    m = found[0]
    if m["pid"] is None:
        who = "an export by an older tuner"
    elif m["host"] != _HOST:
        who = f"an export on host {m['host']} (pid {m['pid']})"
    else:
        who = f"an export that is still running (pid {m['pid']})"
    return (f"{out} holds {m.group(0)}, the temporary folder of {who}; wait for it to finish, or remove the "
            "folder if no export is running")


def check_out(out: Path, force: bool, ours: list[str], earlier_export: bool) -> None:
    """Refuse an out folder whose export paths (`ours`) hold anything but an earlier export of this name."""
    try:
        check_out_kind(out)
        if not (out.is_dir() and any(out.iterdir())):
            return
        present = [n for n in ours if os.path.lexists(out / n)]
        staging = _staging_in(out)
    except OSError as exc:
        raise os_error(exc, out) from None
    if staging is not None:  # not "the earlier export": there is none, only another export's temporary folder
        raise TunerError(staging)
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
        stage = Path(tempfile.mkdtemp(prefix=f".tuner-export-{_HOST}-{os.getpid()}-", dir=out))
        rel = [p.relative_to(stage) for p in write(stage)]
        if verify is not None:
            verify(stage)
        backup = Path(tempfile.mkdtemp(prefix=f".tuner-previous-{_HOST}-{os.getpid()}-", dir=out))
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
