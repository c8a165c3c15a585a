"""The search space of a template: Variant (frozen, named) and its enumeration."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Mapping

from tuner.errors import TunerError
from tuner.kernels.manifest import Manifest, ParamValue, list_templates, load_manifest
from tuner.problem import Problem, check_softcap, check_window, dtype_pattern


@dataclass(frozen=True)
class Variant:
    """One point of a template's space, with the problem features compiled into it.

    `name` is procedural (e.g. attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg)
    and identifies the variant everywhere: entry point, NVTX range, database row.
    """

    template: str
    head_dim: int
    dtype: str
    causal: bool
    params: Mapping[str, ParamValue] = field(hash=False, compare=False)
    # The problem's mask features compiled in (see Problem): window (-1 unbounded) and softcap (0 off).
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    # Packed sequences (Problem layout "packed"): [total, H, D] tensors with cumulative lengths, compiled in.
    packed: bool = False
    _key: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(sorted(self.params.items())))
        object.__setattr__(self, "_key", tuple(self.params.items()))

    def _identity(self) -> tuple:
        return (self.template, self.head_dim, self.dtype, self.causal, self.window_left, self.window_right,
                self.softcap, self.packed, self._key)

    def __hash__(self) -> int:
        return hash(self._identity())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variant) and self._identity() == other._identity()

    @property
    def masked(self) -> bool:
        """Whether a window or a softcap is compiled in."""
        return self.window_left >= 0 or self.window_right >= 0 or self.softcap > 0

    @property
    def name(self) -> str:
        manifest = load_manifest(self.template)
        labels = {p: manifest.params[p].label(v) for p, v in self.params.items()}
        suffix = "_causal" if self.causal else ""
        suffix += mask_suffix(self.window_left, self.window_right, self.softcap)
        suffix += "_packed" if self.packed else ""
        return f"{self.template}_d{self.head_dim}_{self.dtype}_{manifest.name_format.format(**labels)}{suffix}"

    def stored_params(self) -> dict[str, ParamValue]:
        """Tunables plus the compiled-in problem features: the variant's identity in the store (a window,
        a softcap and packing only where set, and a parameter added later only where it differs from the value
        variants had before it, so a variant from before them keeps its identity)."""
        specs = load_manifest(self.template).params
        params = {k: v for k, v in self.params.items() if not _same_type(v, specs[k].absent)}
        features: dict[str, ParamValue] = {"head_dim": self.head_dim, "dtype": self.dtype, "causal": self.causal}
        if self.window_left >= 0:
            features["window_left"] = self.window_left
        if self.window_right >= 0:
            features["window_right"] = self.window_right
        if self.softcap > 0:
            features["softcap"] = self.softcap  # type: ignore[assignment] - a float feature, not a tunable
        if self.packed:
            features["packed"] = True
        return {**params, **features}

    @classmethod
    def from_stored(cls, template: str, stored: Mapping[str, ParamValue]) -> "Variant":
        """Inverse of stored_params (validated against the manifest)."""
        params = load_manifest(template).with_absent({k: v for k, v in stored.items() if k not in _FEATURES})
        try:
            variant = cls(template, int(stored["head_dim"]), str(stored["dtype"]), bool(stored["causal"]), params,
                          int(stored.get("window_left", -1)), int(stored.get("window_right", -1)),
                          float(stored.get("softcap", 0.0)), bool(stored.get("packed", False)))
        except KeyError as exc:
            raise TunerError(f"stored variant of {template} lacks {exc.args[0]!r}") from None
        validate_variant(variant)
        return variant

    def to_dict(self) -> dict:
        return {"template": self.template, "head_dim": self.head_dim, "dtype": self.dtype,
                "causal": self.causal, "window_left": self.window_left, "window_right": self.window_right,
                "softcap": self.softcap, "packed": self.packed, "params": dict(self.params), "name": self.name}


_FEATURES = ("head_dim", "dtype", "causal", "window_left", "window_right", "softcap", "packed")


def mask_suffix(left: int, right: int, softcap: float, sep: str = "_") -> str:
    """A window and softcap as names spell them (variant names, study names, header structs): wl<left>,
    wr<right>, sc<softcap> each after `sep`, where set; "" for neither, so older names stand."""
    return ((f"{sep}wl{left}" if left >= 0 else "") + (f"{sep}wr{right}" if right >= 0 else "")
            + (f"{sep}sc{softcap_label(softcap)}" if softcap > 0 else ""))


def softcap_label(value: float) -> str:
    """A softcap as a name fragment that reads back exactly: 50.0 -> 50, 30.5 -> 30p5, 1e-05 -> 1em05."""
    text = repr(float(value))
    text = text[:-2] if text.endswith(".0") else text
    return text.replace(".", "p").replace("e+", "e").replace("e-", "em")


def parse_softcap_label(text: str) -> float:
    return float(text.replace("em", "e-").replace("p", "."))


def _same_type(value: object, allowed: ParamValue) -> bool:
    return type(value) is type(allowed) and value == allowed


def validate_variant(variant: Variant, manifest: Manifest | None = None) -> None:
    """Raise TunerError unless every value is one the manifest declares."""
    manifest = manifest or load_manifest(variant.template)
    if set(variant.params) != set(manifest.params):
        missing = set(manifest.params) - set(variant.params)
        extra = set(variant.params) - set(manifest.params)
        raise TunerError(f"variant of {manifest.name}: missing parameters {sorted(missing)}, unknown {sorted(extra)}")
    for pname, value in variant.params.items():
        spec = manifest.params[pname]
        if not any(_same_type(value, allowed) for allowed in spec.values):
            raise TunerError(f"{manifest.name}: {pname}={value!r} is not one of {list(spec.values)}")
    if variant.head_dim not in manifest.features.head_dims:
        raise TunerError(f"{manifest.name}: head dim {variant.head_dim} unsupported; supported: {list(manifest.features.head_dims)}")
    if variant.dtype not in manifest.features.dtypes:
        raise TunerError(f"{manifest.name}: dtype {variant.dtype!r} unsupported; supported: {list(manifest.features.dtypes)}")
    if variant.causal and not manifest.features.causal:
        raise TunerError(f"{manifest.name}: causal masking unsupported")
    if (variant.window_left >= 0 or variant.window_right >= 0) and not manifest.features.windows:
        raise TunerError(f"{manifest.name}: sliding windows unsupported")
    if variant.softcap > 0 and not manifest.features.softcap:
        raise TunerError(f"{manifest.name}: logit softcapping unsupported")
    if variant.packed and "packed" not in manifest.features.layouts:
        raise TunerError(f"{manifest.name}: packed sequences unsupported")
    try:  # the Problem's rules
        check_window(variant.window_left, variant.window_right, variant.causal)
        check_softcap(variant.softcap)
    except TunerError as exc:
        raise TunerError(f"{manifest.name}: {exc}") from None
    if variant.window_right == 0:
        raise TunerError(f"{manifest.name}: a right bound of 0 is causality: a variant spells it causal with -1")


@lru_cache(maxsize=None)
def _tunables_pattern(template: str) -> str:
    """Regex of the tunables part of the template's names (name_format, then an optional _causal)."""
    manifest = load_manifest(template)
    pattern = re.escape(manifest.name_format)
    for pname, spec in manifest.params.items():
        alternatives = "|".join(re.escape(lab) for lab in sorted(spec.labels, key=len, reverse=True))
        pattern = pattern.replace(re.escape("{" + pname + "}"), f"(?P<{pname}>{alternatives})")
    return pattern + r"(?P<causal>_causal)?(?:_wl(?P<wl>\d+))?(?:_wr(?P<wr>\d+))?(?:_sc(?P<sc>\d+(?:p\d+)?(?:em?\d+)?))?(?P<packed>_packed)?"


@lru_cache(maxsize=None)
def _name_regex(template: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(template)}_d(?P<head_dim>\d+)_(?P<dtype>{dtype_pattern()})_"
                      rf"{_tunables_pattern(template)}$")


def parse_variant_name(name: str) -> Variant:
    """Inverse of Variant.name (validated against the manifest)."""
    for manifest in sorted(list_templates(), key=lambda m: len(m.name), reverse=True):
        if not name.startswith(manifest.name + "_"):
            continue
        match = _name_regex(manifest.name).match(name)
        if not match:
            break
        params = {p: spec.values[spec.labels.index(match.group(p))] for p, spec in manifest.params.items()}
        wl, wr, sc = match.group("wl"), match.group("wr"), match.group("sc")
        variant = Variant(manifest.name, int(match.group("head_dim")), match.group("dtype"),
                          bool(match.group("causal")), params, int(wl) if wl else -1, int(wr) if wr else -1,
                          parse_softcap_label(sc) if sc else 0.0, bool(match.group("packed")))
        validate_variant(variant, manifest)
        return variant
    raise TunerError(f"not a variant name: {name!r}")


_SHORT_PREFIX = re.compile(rf"^[A-Za-z0-9_]+?_d\d+_(?:{dtype_pattern()})_")


def short_name(name: str) -> str:
    """The tunables part of a variant name, as `tuner results` and the search summary print it:
    the name without its `<template>_d<head dim>_<dtype>_` (a name without one is returned whole)."""
    return _SHORT_PREFIX.sub("", name, count=1)


def templates_of_short_name(short: str) -> list[str]:
    """The templates (by name) one of whose variants has the tunables part `short`."""
    return [m.name for m in list_templates() if re.fullmatch(_tunables_pattern(m.name), short)]


def full_name(short: str, template: str, head_dim: int, dtype: str) -> str:
    """Inverse of short_name for the variant of `template` with that head dim and dtype."""
    return f"{template}_d{head_dim}_{dtype}_{short}"


def variant_from_params(template: str, problem: Problem, params: Mapping[str, ParamValue]) -> Variant:
    variant = Variant(template, problem.head_dim, problem.dtype, problem.causal, dict(params), *mask_of(problem),
                      packed=problem.packed)
    validate_variant(variant)
    return variant


def mask_of(problem: Problem) -> tuple[int, int, float]:
    """The mask features of a problem a variant compiles in: (window_left, window_right, softcap)."""
    return (problem.window_left, problem.window_right, problem.softcap)


def enumerate_space(template: str, problem: Problem) -> Iterator[Variant]:
    """Every combination of the template's parameter values for this problem (feasible or not)."""
    manifest = load_manifest(template)
    names = list(manifest.params)
    for values in itertools.product(*(manifest.params[n].values for n in names)):
        yield Variant(template, problem.head_dim, problem.dtype, problem.causal, dict(zip(names, values)),
                      *mask_of(problem), packed=problem.packed)
