"""Where the shipped data folders live: inside the wheel or in a checkout."""

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def asset_dir(name: str) -> Path:
    """Return the folder `name` (kernel_templates, profiles or db).

    An installed wheel carries them under tuner/_assets (see pyproject's
    force-include); a source checkout has them at the repository root.
    """
    for candidate in (_PACKAGE_DIR / "_assets" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tuner data folder {name!r} not found next to {_PACKAGE_DIR}")
