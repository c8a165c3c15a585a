"""Kernel template manifests: the parameters, features, constraints and resources a template declares."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from tuner.assets import asset_dir
from tuner.errors import TunerError
from tuner.problem import PASSES

ParamValue = int | bool | str

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a `cxx` spelling may be: a (qualified) C++ name such as fc::Swizzle::Pad,
# or an integer literal; it is pasted into the rendered source.
_CXX_SPELLING = re.compile(r"^(?:(?:::)?[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*|-?[0-9]+)$")
# A quoted #include; angle-bracket includes are the toolkit's, covered by its version.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)
# The same, to the end of its line (what inline_headers replaces), and a #pragma once line.
_INCLUDE_LINE = re.compile(_INCLUDE.pattern + r"[^\n]*$", re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b[^\n]*\n?", re.MULTILINE)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    values: tuple[ParamValue, ...]
    doc: str
    labels: tuple[str, ...]  # how each value appears in a variant name, same order as values
    # How each value is spelled in the C++ instantiation, same order as values;
    # None: the value itself (an int, true/false). String values always have one.
    cxx: tuple[str | None, ...] = ()
    # A parameter added to a template after variants of it were stored: the value they were built with. Left out
    # of a variant's stored identity where it has it, filled in where a stored variant lacks it (Variant).
    absent: ParamValue | None = None

    def label(self, value: ParamValue) -> str:
        return self.labels[self.values.index(value)]

    def cxx_spelling(self, value: ParamValue) -> str | None:
        return self.cxx[self.values.index(value)] if self.cxx else None


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
    max_seq_q: int = 0  # the longest query the search picks the template for (0: any)
    seq_lens: bool = False  # takes per-row key lengths (a ragged batch: Problem.lengths other than full)
    windows: bool = False  # sliding windows (Problem.window_left / window_right), compiled in ("mask" config arg)
    softcap: bool = False  # logit softcapping (Problem.softcap), compiled in ("mask" config arg)


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
    # sha256 of the manifest, the template source and every header it includes
    # (with their names): identifies the code measured
    source_hash: str
    # The source and every header it includes, recursively: path relative to
    # the templates folder (posix) -> file. The source comes first, then the
    # headers by name. Copying each file to <dest>/<relative path> gives a
    # folder in which the source (or a rendered variant of it placed there)
    # compiles with no -I.
    files: dict[str, Path] = field(default_factory=dict)
    # Where its quoted #includes resolve (overlaid, earlier first): the
    # templates folders (template_folders()), then the manifest's own folder
    # if it is not one of them.
    include_dirs: tuple[Path, ...] = ()
    # Attributes written on the entry point after __launch_bounds__ (e.g. __cluster_dims__(...)).
    entry_attributes: str = ""
    # Which pass of attention the template computes: "forward" (the default) or "backward" (dQ, dK, dV from the
    # forward's output and log-sum-exp); its entry points take ATTN_FWD_PARAMS or ATTN_BWD_PARAMS.
    kernel_pass: str = "forward"
    # Entry points beside the main one (named after the variant), each <name>_<aux> with the body
    # ATTN_BWD_BODY_<AUX> (e.g. a backward's preprocessing and dQ conversion kernels).
    aux_entries: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return self.source_path.read_text()

    def with_absent(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """Stored `params` with each parameter added since (ParamSpec.absent) at the value they were built with."""
        return {**{n: s.absent for n, s in self.params.items() if s.absent is not None and n not in params}, **params}


def _default_label(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _value_key(value: ParamValue) -> str:
    """How a value is named as a key of a manifest's `labels` and `cxx` tables."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cxx_spellings(spec: dict[str, Any], values: tuple[ParamValue, ...], where: str) -> tuple[str | None, ...]:
    """The `cxx` table of one parameter, in the order of its values; every string value needs a spelling."""
    table = spec.get("cxx", {})
    if not isinstance(table, dict):
        raise TunerError(f"{where} cxx must be a table of value = \"C++ spelling\"")
    keys = {_value_key(v) for v in values}
    unknown = sorted(set(table) - keys)
    if unknown:
        raise TunerError(f"{where} cxx names {', '.join(map(repr, unknown))}, not among its values")
    missing = [v for v in values if isinstance(v, str) and _value_key(v) not in table]
    if missing:
        raise TunerError(f"{where} string value(s) {', '.join(map(repr, missing))} have no C++ spelling: "
                         f"add them to its cxx table (e.g. cxx = {{ {missing[0]} = \"ns::Enum::Name\" }})")
    bad = [str(s) for s in table.values() if not isinstance(s, str) or not _CXX_SPELLING.match(s)]
    if bad:
        raise TunerError(f"{where} cxx spelling(s) {', '.join(map(repr, bad))} are not C++ names or integers")
    if not table:
        return ()
    return tuple(table.get(_value_key(v)) for v in values)


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise TunerError(f"{where}: missing field {key!r}")
    if not isinstance(data[key], kind):
        raise TunerError(f"{where}: field {key!r} has the wrong type ({type(data[key]).__name__})")
    return data[key]


def _param_spec(pname: str, spec: dict[str, Any], where: str) -> ParamSpec:
    """One [params.NAME] table, validated; errors name the manifest (`where`) and the parameter."""
    if not _IDENT.match(pname):
        raise TunerError(f"{where}: parameter name {pname!r} is not an identifier")
    values = tuple(_require(spec, "values", list, f"{where} [params.{pname}]"))
    if not values or not all(isinstance(v, (int, str)) for v in values):
        raise TunerError(f"{where}: [params.{pname}] values must be a non-empty list of ints, bools or strings")
    labels_map = spec.get("labels", {})
    labels = tuple(str(labels_map.get(_value_key(v), _default_label(v))) for v in values)
    if len(set(labels)) != len(labels) or not all(_IDENT.match("x" + lab) for lab in labels):
        raise TunerError(f"{where}: [params.{pname}] labels must be distinct identifier fragments")
    cxx = _cxx_spellings(spec, values, f"{where}: [params.{pname}]")
    absent = spec.get("absent")
    if absent is not None and not any(type(absent) is type(v) and absent == v for v in values):
        raise TunerError(f"{where}: [params.{pname}] absent = {absent!r} is not one of its values")
    return ParamSpec(pname, values, str(spec.get("doc", "")), labels, cxx, absent)


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
    params = {pname: _param_spec(pname, spec, where)
              for pname, spec in _require(data, "params", dict, where).items()}
    config_args = tuple(_require(data, "config_args", list, where))
    for arg in config_args:
        if arg not in params and arg not in ("dtype", "head_dim", "causal", "mask", "packed"):
            raise TunerError(f"{where}: config_args names unknown parameter {arg!r}")
    name_format = _require(data, "name_format", str, where)
    kernel_pass, aux_entries = _pass_fields(data, where)
    for pname in params:
        if "{" + pname + "}" not in name_format:
            raise TunerError(f"{where}: name_format must contain {{{pname}}}")
    include_dirs = template_folders()
    if not any(_same_dir(path.parent, d) for d in include_dirs):
        include_dirs += (path.parent,)
    try:
        files = template_files(source_path, include_dirs)
    except TunerError as exc:
        raise TunerError(f"{where}: {exc}") from None
    for rel, found in list(files.items())[1:]:
        mine = path.parent / rel
        if mine.is_file() and not mine.samefile(found):
            raise TunerError(f"{where}: header {rel} of this template is shadowed by {found} (header paths, like "
                             f"template names, come from the first templates folder that has them); rename yours")
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
            max_seq_q=int(feats.get("max_seq_q", 0)),
            seq_lens=bool(feats.get("seq_lens", False)),
            windows=bool(feats.get("windows", False)),
            softcap=bool(feats.get("softcap", False)),
        ),
        params=params,
        name_format=name_format,
        constraints=tuple(
            Constraint(_require(c, "rule", str, f"{where} [[constraints]]"), _require(c, "reason", str, where))
            for c in data.get("constraints", [])
        ),
        resources={k: str(v) for k, v in _require(data, "resources", dict, where).items()},
        source_hash=_source_hash(path, files),
        files=files,
        include_dirs=include_dirs,
        entry_attributes=str(data.get("entry_attributes", "")),
        kernel_pass=kernel_pass,
        aux_entries=aux_entries,
    )


def _pass_fields(data: dict[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    """A manifest's `pass` ("forward" when absent) and `aux_entries` (identifiers), validated."""
    kernel_pass = data.get("pass", "forward")
    if kernel_pass not in PASSES:
        raise TunerError(f"{where}: pass must be one of {', '.join(PASSES)}, not {kernel_pass!r}")
    aux = data.get("aux_entries", [])
    if not isinstance(aux, list) or not all(isinstance(e, str) and _IDENT.match(e) for e in aux):
        raise TunerError(f"{where}: aux_entries must be a list of identifiers")
    return kernel_pass, tuple(aux)


def template_folders() -> tuple[Path, ...]:
    """The folders templates come from: the shipped one, then those of
    TUNER_TEMPLATE_PATH (os.pathsep-separated) in order.

    They are also the include path of every template (and compile_source's
    default), overlaid in this order: `#include "common/utils.h"` in a
    template of any of them finds the shipped common/ headers, and where two
    folders hold the same relative path the earlier one wins, as for
    template names (loading a template whose own copy of a header is
    shadowed that way is an error, not a silent surprise).
    """
    folders = [asset_dir("kernel_templates")]
    folders += [Path(entry) for entry in os.environ.get("TUNER_TEMPLATE_PATH", "").split(os.pathsep) if entry.strip()]
    return tuple(folders)


def _resolve_include(folder: str, name: str, include_dirs: tuple[Path, ...]) -> tuple[str, Path] | None:
    """Where `#include "name"` in a file of `folder` (relative to the overlaid
    include dirs) resolves: next to the includer first, then from the root.
    None where it is in none of them (left to nvcc)."""
    for rel in dict.fromkeys((posixpath.normpath(posixpath.join(folder, name)), posixpath.normpath(name))):
        if rel == ".." or rel.startswith(("../", "/")):
            continue
        for root in include_dirs:
            candidate = Path(root) / rel
            if candidate.is_file():
                return rel, candidate
    return None


def _read_header(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TunerError(f"cannot read header {path} ({exc})") from None


def find_headers(text: str, include_dirs: tuple[Path, ...]) -> dict[str, Path]:
    """Headers reachable from source `text` through quoted #include lines.

    The include dirs are overlaid into one tree (earlier ones win). A quoted
    include is resolved as the preprocessor does, in that tree: relative to
    the including file's folder first, then from the tree's root; the source
    itself sits at the root. Returns relative posix path -> file, sorted by
    path. Includes found nowhere in the tree (the toolkit's own headers,
    say) are left to nvcc.
    """
    found: dict[str, Path] = {}
    pending = [("", text)]
    while pending:
        folder, body = pending.pop()
        for name in _INCLUDE.findall(body):
            resolved = _resolve_include(folder, name, include_dirs)
            if resolved is not None and resolved[0] not in found:
                rel, path = resolved
                found[rel] = path
                pending.append((posixpath.dirname(rel), _read_header(path)))
    return dict(sorted(found.items()))


def inline_headers(text: str, include_dirs: tuple[Path, ...]) -> str:
    """Source `text` as one file: each header find_headers finds pasted in
    place of its first #include line, depth first (the order the preprocessor
    reads them), between `// ---- begin/end <folder>/<path> ----` lines; a
    later #include of it becomes a comment and its `#pragma once` goes (nvcc
    warns of one in the main file). Like find_headers, this assumes headers
    are include-once and not included under #if. Includes found nowhere in
    the tree (<cuda_fp16.h>, ...) stay as they are.
    """
    done: set[str] = set()

    def expand(folder: str, body: str) -> str:
        def paste(match: re.Match[str]) -> str:
            resolved = _resolve_include(folder, match.group(1), include_dirs)
            if resolved is None:
                return match.group(0)
            rel, path = resolved
            label = f"{path.parents[rel.count('/')].name}/{rel}"  # the templates folder's name, then the path in it
            if rel in done:
                return f"// #include \"{match.group(1)}\": {label}, inlined above"
            done.add(rel)
            inner = expand(posixpath.dirname(rel), _PRAGMA_ONCE.sub("", _read_header(path)))
            return f"// ---- begin {label} ----\n{inner.rstrip()}\n// ---- end {label} ----"

        return _INCLUDE_LINE.sub(paste, body)

    return expand("", text)


def template_files(source_path: Path, include_dirs: tuple[Path, ...]) -> dict[str, Path]:
    """A template source and the headers it includes (see Manifest.files)."""
    return {source_path.name: source_path, **find_headers(source_path.read_text(), include_dirs)}


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def _source_hash(manifest_path: Path, files: dict[str, Path]) -> str:
    """sha256 of the manifest, the source and its headers (name and content,
    in Manifest.files order). A template without headers hashes as before."""
    source_rel, *headers = files
    digest = hashlib.sha256(manifest_path.read_text().encode() + b"\0" + files[source_rel].read_text().encode())
    for rel in headers:
        digest.update(b"\0" + rel.encode() + b"\0" + files[rel].read_bytes())
    return digest.hexdigest()


def _manifest_paths() -> dict[str, Path]:
    """Template name -> manifest: from the folders of template_folders(), in
    order; the first one found wins."""
    paths: dict[str, Path] = {}
    for folder in template_folders():
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
