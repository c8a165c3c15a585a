"""Which variant `tuner render` means: a trial id, a full variant name, or the tunables part of
one, as `tuner results` and the search summary print it (completed from options or the store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tuner.cli.state import MAX_ID, may_create_store
from tuner.errors import TunerError
from tuner.kernels.manifest import list_templates, load_manifest
from tuner.kernels.variant import (
    Variant,
    full_name,
    parse_variant_name,
    short_name,
    templates_of_short_name,
)
from tuner.problem import DTYPES
from tuner.profiles import load_profile
from tuner.store import TrialFilter, open_store


@dataclass(frozen=True)
class NameHints:
    """What the command line says beside the name; None: not given."""

    gpu: Optional[str] = None
    template: Optional[str] = None
    head_dim: Optional[int] = None
    dtype: Optional[str] = None


@dataclass(frozen=True)
class RenderTarget:
    variant: Variant
    arch: Optional[str]  # the card's arch for the nvcc command; None: the template's first
    warning: str = ""  # a line for stderr (a trial measured with an older template)


def resolve_render_target(name: str, hints: NameHints, db_url: Optional[str]) -> RenderTarget:
    """The variant and arch that `name` and the options mean; one-line TunerErrors say what is missing."""
    name = name.strip()
    if hints.template is not None:
        load_manifest(hints.template)  # an unknown template is named as such
    if hints.dtype is not None and hints.dtype not in DTYPES:
        raise TunerError(f"unknown dtype {hints.dtype!r}; expected one of {', '.join(DTYPES)}")
    arch = load_profile(hints.gpu).nvcc_arch if hints.gpu else None
    if name.isascii() and name.isdigit():
        target = _from_trial(int(name), db_url)
        target = RenderTarget(target.variant, arch or target.arch, target.warning)
    elif any(name.startswith(f"{m.name}_d") for m in list_templates()):
        target = RenderTarget(parse_variant_name(name), arch)
    elif templates_of_short_name(name):
        target = _from_short_name(name, hints, arch, db_url)
    else:
        raise TunerError(f"not a trial id or variant name: {name!r} (expected e.g. 12, {_example()} or "
                         f"{short_name(_example())}, as `tuner results` prints it)")
    _check_hints(target.variant, hints)
    archs = load_manifest(target.variant.template).archs
    if hints.gpu and arch not in archs:
        raise TunerError(f"{target.variant.template} is built for {', '.join(archs)}, not {arch} (--gpu {hints.gpu})")
    return target


def _from_trial(trial_id: int, db_url: Optional[str]) -> RenderTarget:
    if trial_id > MAX_ID:  # beyond the id column: no such trial (not an overflow in the driver)
        raise TunerError(f"no trial with id {trial_id}")
    with open_store(db_url, create=may_create_store()) as store:
        detail = store.trial_detail(trial_id)
    variant = Variant.from_stored(detail.template, detail.params)
    now = load_manifest(detail.template).source_hash
    warning = "" if detail.template_hash == now else (
        f"trial {trial_id} measured {detail.template} @ {detail.template_hash[:12]}; the template has changed "
        f"since (now @ {now[:12]}): this is the source of today's template")
    return RenderTarget(variant, _profile_arch(detail.profile), warning)


def _from_short_name(short: str, hints: NameHints, arch: Optional[str], db_url: Optional[str]) -> RenderTarget:
    """Template, head dim and dtype from the options, else from the stored trials of that name."""
    templates = templates_of_short_name(short)
    if hints.template is not None:
        if hints.template not in templates:
            raise TunerError(f"{short!r} is not the tunables part of a variant name of {hints.template} "
                             f"(they read like {short_name(_example(hints.template))})")
        templates = [hints.template]
    choices = _choices(templates, hints)
    if all(len(values) == 1 for _, values in choices):
        (template,), (head_dim,), (dtype,) = (values for _, values in choices)
        return RenderTarget(parse_variant_name(full_name(short, template, head_dim, dtype)), arch)
    stored = _stored_variants(short, hints, templates, db_url)
    variants = sorted({v for v, _ in stored}, key=lambda v: v.name)
    if len(variants) == 1:
        archs = {a for _, a in stored if a is not None}
        return RenderTarget(variants[0], arch or (archs.pop() if len(archs) == 1 else None))
    if variants:  # what tells the stored ones apart
        choices = [(option, sorted({getattr(v, field) for v in variants}))
                   for (option, _), field in zip(choices, ("template", "head_dim", "dtype"))]
    give = _listed([f"{option} ({_listed(values, 'or')})" for option, values in choices if len(values) > 1], "and")
    if variants:
        listed = ", ".join(v.name for v in variants[:3]) + (", ..." if len(variants) > 3 else "")
        raise TunerError(f"{short!r} names {len(variants)} stored variants ({listed}): give {give}")
    raise TunerError(f"{short!r} is the tunables part of a variant name, and no stored trial"
                     f"{' matching these options' if hints != NameHints() else ''} has it: give {give}")


def _choices(templates: list[str], hints: NameHints) -> list[tuple[str, list]]:
    """Per option (--template, --head-dim, --dtype): the values the options and templates leave."""
    manifests = [load_manifest(t) for t in templates]
    head_dims = [hints.head_dim] if hints.head_dim is not None else [d for m in manifests for d in m.features.head_dims]
    dtypes = [hints.dtype] if hints.dtype is not None else [d for m in manifests for d in m.features.dtypes]
    return [("--template", sorted(templates)), ("--head-dim", sorted(set(head_dims))), ("--dtype", sorted(set(dtypes)))]


def _stored_variants(short: str, hints: NameHints, templates: list[str],
                     db_url: Optional[str]) -> list[tuple[Variant, Optional[str]]]:
    """(variant, arch of its card) of the stored trials whose tunables part is `short`."""
    filt = TrialFilter(gpu=hints.gpu, dtype=hints.dtype, template=hints.template)
    with open_store(db_url, create=may_create_store()) as store:
        rows = store.variant_names("_" + short, filt)
    found = []
    for name, profile in rows:
        try:
            variant = parse_variant_name(name)
        except TunerError:  # named under an older manifest: not one today's templates can render
            continue
        if short_name(name) == short and variant.template in templates and hints.head_dim in (None, variant.head_dim):
            found.append((variant, _profile_arch(profile)))
    return found


def _profile_arch(profile: str) -> Optional[str]:
    """The arch of a stored trial's card; None (the template's first) for a profile no longer shipped."""
    try:
        return load_profile(profile).nvcc_arch
    except TunerError:
        return None


def _listed(values: list, last: str) -> str:
    """'a', 'a or b', 'a, b or c'."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def _check_hints(variant: Variant, hints: NameHints) -> None:
    """Options given with a trial id or a full name must agree with it."""
    for option, given, actual in (("--template", hints.template, variant.template),
                                  ("--head-dim", hints.head_dim, variant.head_dim),
                                  ("--dtype", hints.dtype, variant.dtype)):
        if given is not None and given != actual:
            raise TunerError(f"{variant.name} has {option} {actual}, not {given}")


def _example(template: Optional[str] = None) -> str:
    """A variant name of `template` (default: the first), each parameter at its first value."""
    manifest = load_manifest(template) if template else list_templates()[0]
    params = {p: spec.values[0] for p, spec in manifest.params.items()}
    return Variant(manifest.name, manifest.features.head_dims[0], manifest.features.dtypes[0], False, params).name
