"""Kernel template manifests: the parameters, features, constraints and resources a template declares."""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuner.assets import asset_dir
from tuner.errors import TunerError

ParamValue = int | bool | str

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    values: tuple[ParamValue, ...]
    doc: str
    labels: tuple[str, ...]  # how each value appears in a variant name, same order as values

    def label(self, value: ParamValue) -> str:
        return self.labels[self.values.index(value)]


@dataclass(frozen=True)
class Constraint:
    rule: str
    reason: str


@dataclass(frozen=True)
class Features:
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: bool
    gqa: bool
    layouts: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    name: str
    source_path: Path
    description: str
    config: str
    archs: tuple[str, ...]
    min_compute_capability: tuple[int, int]
    config_args: tuple[str, ...]
    features: Features
    params: dict[str, ParamSpec]
    name_format: str
    constraints: tuple[Constraint, ...]
    resources: dict[str, str]
    source_hash: str  # sha256 of the template source and manifest: identifies the code measured

    @property
    def source(self) -> str:
        return self.source_path.read_text()


def _default_label(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise TunerError(f"{where}: missing field {key!r}")
    if not isinstance(data[key], kind):
        raise TunerError(f"{where}: field {key!r} has the wrong type ({type(data[key]).__name__})")
    return data[key]


def load_manifest_file(path: Path) -> Manifest:
    """Parse and validate one manifest; errors name the file and the field."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TunerError(f"{where}: cannot read manifest ({exc})") from None
    name = _require(data, "name", str, where)
    source_path = path.parent / _require(data, "source", str, where)
    if not source_path.is_file():
        raise TunerError(f"{where}: source file {source_path.name} not found")
    feats = _require(data, "features", dict, where)
    params: dict[str, ParamSpec] = {}
    for pname, spec in _require(data, "params", dict, where).items():
        if not _IDENT.match(pname):
            raise TunerError(f"{where}: parameter name {pname!r} is not an identifier")
        values = tuple(_require(spec, "values", list, f"{where} [params.{pname}]"))
        if not values or not all(isinstance(v, (int, str)) for v in values):
            raise TunerError(f"{where}: [params.{pname}] values must be a non-empty list of ints, bools or strings")
        labels_map = spec.get("labels", {})
        labels = tuple(str(labels_map.get(str(v).lower() if isinstance(v, bool) else str(v), _default_label(v)))
                       for v in values)
        if len(set(labels)) != len(labels) or not all(_IDENT.match("x" + lab) for lab in labels):
            raise TunerError(f"{where}: [params.{pname}] labels must be distinct identifier fragments")
        params[pname] = ParamSpec(pname, values, str(spec.get("doc", "")), labels)
    config_args = tuple(_require(data, "config_args", list, where))
    for arg in config_args:
        if arg not in params and arg not in ("dtype", "head_dim", "causal"):
            raise TunerError(f"{where}: config_args names unknown parameter {arg!r}")
    name_format = _require(data, "name_format", str, where)
    for pname in params:
        if "{" + pname + "}" not in name_format:
            raise TunerError(f"{where}: name_format must contain {{{pname}}}")
    text = path.read_text() + "\0" + source_path.read_text()
    return Manifest(
        name=name,
        source_path=source_path,
        description=str(data.get("description", "")),
        config=_require(data, "config", str, where),
        archs=tuple(_require(data, "archs", list, where)),
        min_compute_capability=tuple(_require(data, "min_compute_capability", list, where)),  # type: ignore[arg-type]
        config_args=config_args,
        features=Features(
            head_dims=tuple(_require(feats, "head_dims", list, f"{where} [features]")),
            dtypes=tuple(_require(feats, "dtypes", list, f"{where} [features]")),
            causal=bool(_require(feats, "causal", bool, f"{where} [features]")),
            gqa=bool(_require(feats, "gqa", bool, f"{where} [features]")),
            layouts=tuple(_require(feats, "layouts", list, f"{where} [features]")),
        ),
        params=params,
        name_format=name_format,
        constraints=tuple(
            Constraint(_require(c, "rule", str, f"{where} [[constraints]]"), _require(c, "reason", str, where))
            for c in data.get("constraints", [])
        ),
        resources={k: str(v) for k, v in _require(data, "resources", dict, where).items()},
        source_hash=hashlib.sha256(text.encode()).hexdigest(),
    )


def _manifest_paths() -> dict[str, Path]:
    """Template name -> manifest: the shipped folder first, then the folders of
    TUNER_TEMPLATE_PATH (os.pathsep-separated) in order; the first one found wins."""
    folders = [asset_dir("kernel_templates")]
    folders += [Path(entry) for entry in os.environ.get("TUNER_TEMPLATE_PATH", "").split(os.pathsep) if entry.strip()]
    paths: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            paths.setdefault(path.stem, path)
    return paths


@lru_cache(maxsize=None)
def load_manifest(name: str) -> Manifest:
    paths = _manifest_paths()
    if name not in paths:
        raise TunerError(f"unknown kernel template {name!r}; known: {', '.join(sorted(paths)) or 'none'}")
    return load_manifest_file(paths[name])


def list_templates() -> list[Manifest]:
    return [load_manifest(name) for name in _manifest_paths()]
