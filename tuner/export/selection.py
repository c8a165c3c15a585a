"""Which kernels an export holds: the store's best ok trials, rebuilt and checked, keyed for dispatch."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

# The shipped dispatch module is standard-library only: the tuner keys entries with it (one definition).
from tuner.errors import TunerError
from tuner.runtime.shipped.dispatch import Key
from tuner.kernels.manifest import list_templates, load_manifest
from tuner.kernels.variant import Variant, mask_of
from tuner.problem import DTYPES, FORWARD, FULL_LENGTHS, Problem, parse_shape
from tuner.profiles import GpuProfile
from tuner.runtime.build import BuiltKernel, build
from tuner.store import TrialFilter, TrialRow


@dataclass(frozen=True)
class ExportedKernel:
    """A built variant as an export ships it: the cubin's bytes, and whether they differ from the measured ones."""

    built: BuiltKernel
    cubin: bytes
    rebuilt: bool  # the cubin differs from (or could not be checked against) the measured one
    backward: Optional[dict[str, Any]] = None  # a backward kernel's launch facts (BackwardShape's fields)

    @property
    def variant(self) -> Variant:
        return self.built.variant

    @property
    def source(self) -> str:
        return self.built.source


def _model_fields(p: Problem) -> tuple:
    """What a model's problem fixes beyond shape and dtype (its K/V layout and lengths are the search's)."""
    return (p.causal, p.heads_kv, p.window_left, p.window_right, p.softcap)


def select_trials(store: Any, profile: GpuProfile, shapes: tuple[str, ...], dtype: Optional[str],
                  model_problems: tuple[Problem, ...] = ()) -> list[TrialRow]:
    """Best ok trial per tuned problem of this profile (one per problem: causal, GQA, layout kept apart), by
    back-to-back µs: a time confirm stage's winner where there is one (an energy or isolated stage's winner is
    another objective's), and the current template code's trials before older code's, whose figures describe
    other kernels (a problem measured only with older code keeps its best, exported if its cubin is unchanged)."""
    if dtype is not None and dtype not in DTYPES:
        raise TunerError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    # An export's entries are forward problems: a backward problem's confirmed winner ships beside its forward's
    # (tuner.export.backward_selection), never as an entry of its own.
    wanted: list[tuple[TrialFilter, Optional[Problem]]] = [
        (TrialFilter(gpu=profile.name, kernel_pass=FORWARD, shape=(p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim),
                     dtype=p.dtype), p)
        for p in model_problems]
    wanted = wanted or [(TrialFilter(gpu=profile.name, kernel_pass=FORWARD, shape=parse_shape(s), dtype=dtype), None)
                        for s in shapes] or \
        [(TrialFilter(gpu=profile.name, kernel_pass=FORWARD, dtype=dtype), None)]
    current = tuple(sorted(m.source_hash for m in list_templates()))
    rows: dict[int, TrialRow] = {}
    for filt, problem in wanted:
        best = store.best_trials(dataclasses.replace(filt, template_hashes=current))
        tuned = {(r.problem, r.profile) for r in best}
        best += [r for r in store.best_trials(filt) if (r.problem, r.profile) not in tuned]
        found = store.prefer_confirmed([r for r in best if r.profile == profile.name and
                                        (problem is None or _model_fields(r.problem) == _model_fields(problem))],
                                       objective="time")
        if not found:
            what = (problem.label if problem is not None else f"shape {','.join(map(str, filt.shape))}"
                    if filt.shape else "any problem") + (f", {dtype}" if dtype and problem is None else "")
            raise TunerError(f"no ok trials for {profile.name} ({what}) in the store; "
                             f"run `tuner search --gpu {profile.name}` first")
        rows.update((r.id, r) for r in found)
    return sorted(rows.values(), key=lambda r: r.id)


def build_kernel(row: TrialRow, arch: str, allow_rebuild: bool) -> ExportedKernel:
    """Build the trial's variant; refuse when it is not the kernel the search measured."""
    built = build(Variant.from_stored(row.template, row.params), arch)
    variant, result = built.variant, built.compiled
    if not result.ok:
        raise TunerError(f"trial {row.id}: {variant.name} no longer compiles for {arch}: "
                         f"{result.log.strip().splitlines()[-1] if result.log.strip() else 'nvcc failed'}")
    cubin = result.cubin  # the bytes that will be shipped, hashed here: the cache's record is not trusted
    shipped_sha = hashlib.sha256(cubin).hexdigest()
    if row.cubin_sha256:
        same = shipped_sha == row.cubin_sha256
        why = f"cubin sha256 {shipped_sha[:12]} != stored {row.cubin_sha256[:12]}"
    else:  # nothing to compare the cubin with: fall back on the template's hash
        same = row.template_hash == load_manifest(row.template).source_hash
        why = "template hash differs from the one stored with the trial"
    if not same and not allow_rebuild:
        raise TunerError(f"trial {row.id}: the store's kernel no longer matches the template ({why}; the template "
                         f"or nvcc changed since the search); re-run the search, or pass --allow-rebuild to export "
                         f"the rebuilt kernel")
    return ExportedKernel(built, cubin, rebuilt=not same)


ROUTE_BELOW = 0.98  # a cell whose kernel measured below this ratio to the best SDPA backend runs SDPA


def sdpa_ratio(store: Any, row: TrialRow, baselines: list[Any]) -> Optional[float]:
    """The trial's speed-up over the fastest SDPA backend of its run (what a routed cell falls back to;
    FlashAttention-4, when it was a baseline, is left out): the confirm stage's median per-round ratio
    when the row is a confirmed winner, else the ratio of medians over `baselines` (its run's, from
    store.trial_detail)."""
    from tuner.runtime.baselines import SDPA_BACKENDS
    from tuner.runtime.timing import per_round_ratio

    if row.confirmed_us is not None:
        confirmed = store.confirmed(row.problem, row.profile, objective="time")
        timings = store.confirm_timings(confirmed.confirmation_id) if confirmed else {}
        sdpa = [timings[n] for n in SDPA_BACKENDS if n in timings]
        mine = timings.get(row.variant_name)
        if sdpa and mine:
            return per_round_ratio(best_per_round(sdpa), mine)
    sdpa_us = [b.median_us for b in baselines if b.impl in SDPA_BACKENDS]
    return min(sdpa_us) / row.median_us if sdpa_us and row.median_us else None


def best_per_round(baselines: list[list[float]]) -> list[float]:
    """The fastest baseline's µs in each round, from each baseline's µs per round (a baseline the confirm
    stage stopped timing early counts in the rounds it ran)."""
    rounds = max((len(b) for b in baselines), default=0)
    return [min(b[r] for b in baselines if r < len(b)) for r in range(rounds)]


def dispatch_key(problem: Problem) -> Key:
    """The dispatch key calls of `problem`'s shape, window, softcap and K/V layout look up (the shipped dispatch's
    Key.of): a paged layout's page size, and per-row lengths for a ragged batch or pages. A packed problem's key
    is packed (what attention_varlen looks up: Sq and Sk the longest sequence drawn, which may fall short of the
    problem's bound, batch the number of sequences); its lengths kind is not a key field there (every packed call
    has its own lengths, cu_seqlens)."""
    longest = max(problem.key_lengths()) if problem.packed else 0
    return Key.of(problem.dtype, problem.head_dim, problem.causal, problem.heads, problem.heads_kv,
                  longest or problem.seq_q, longest or problem.seq_k, batch=problem.batch, mask=mask_of(problem),
                  page_size=problem.page_size, seq_lens=problem.ragged and not problem.packed, packed=problem.packed)


def _dispatch_key(problem: Problem) -> dict[str, Any]:
    return dataclasses.asdict(dispatch_key(problem))


def entry_of(row: TrialRow, kernel: ExportedKernel, run: Any, ratio_to_sdpa: Optional[float]) -> dict[str, Any]:
    """The manifest entry of one exported trial: its dispatch key, kernel, timings and provenance
    (`ratio_to_sdpa`: sdpa_ratio(), which decides the entry's route)."""
    p = row.problem
    return {
        "key": _dispatch_key(p),
        "kernel": kernel.variant.name,
        "trial_id": row.id,
        "problem": p.to_dict(),
        "problem_label": p.label,
        "median_us": row.headline_us,  # the confirmed figure when the confirm stage ran
        "confirmed": row.confirmed_us is not None,
        "p20_us": row.p20_us,
        "p80_us": row.p80_us,
        "tflops": row.tflops,
        "best_baseline_impl": row.best_baseline_impl,
        "best_baseline_us": row.best_baseline_us,
        "ratio_to_best_baseline": row.headline_ratio,
        "ratio_to_sdpa": ratio_to_sdpa,
        **energy_fields(row),
        "rebuilt": kernel.rebuilt,
        # A template for short queries (decode) computes any Sq, slowly: dispatch never sends longer ones to it.
        "max_seq_q": load_manifest(row.template).features.max_seq_q,
        "run": {"run_id": row.run_id, "gpu_name": row.gpu_name, "profile": row.profile,
                "driver": getattr(run, "driver", None), "cuda_version": getattr(run, "cuda_version", None),
                "torch_version": getattr(run, "torch_version", None),
                "tuner_version": getattr(run, "tuner_version", None),
                # A replayed run (`--backend replay`) measured nothing: its timings are the recording's.
                "replayed_from": getattr(run, "replayed_from", None)},
        "dispatch": True,
        # Slower than the best SDPA backend on its own tuned problem: the export must not make a model
        # slower, so calls of this cell run SDPA (explain() says so). Not with a softcap: SDPA has none, and
        # the fallback there (a torch implementation) is no SDPA timing; nor over an FP8 KV cache: the search's
        # SDPA ran on k and v dequantised beforehand, the package's fallback dequantises in every call (export
        # --check measures both).
        "route": "sdpa" if (ratio_to_sdpa is not None and ratio_to_sdpa < ROUTE_BELOW and not p.softcap
                            and not p.fp8_kv) else None,
    }


def energy_fields(row: TrialRow) -> dict[str, Optional[float]]:
    """The kernel's and its best baseline's energy figures (None where not measured): J per call back to
    back (the confirm stage's median for a confirmed winner that measured it), board power, SM clock, and
    TFLOP/s per watt."""
    e, b = row.energy, row.best_baseline_energy
    base_tflops = row.problem.tflops(row.best_baseline_us) if row.best_baseline_us else None
    return {
        "joules_per_call": row.headline_joules, "power_w": e.power_w if e else None,
        "sm_mhz": e.sm_mhz if e else None, "tflops_per_watt": row.tflops_per_watt,
        "best_baseline_joules_per_call": b.joules_per_call if b else None,
        "best_baseline_power_w": b.power_w if b else None, "best_baseline_sm_mhz": b.sm_mhz if b else None,
        "best_baseline_tflops_per_watt": b.tflops_per_watt(base_tflops) if b else None,
    }


def resolve_collisions(entries: list[dict[str, Any]]) -> None:
    """One entry per dispatch key: the largest tuned problem wins (long runs are where tuning pays); at equal
    size one tuned on a ragged batch before one at full lengths. A key holds both only for a paged layout (its
    calls always pass lengths; a dense batch's lengths kind is in its key), and serving engines' paged batches
    are ragged."""
    def rank(e: dict[str, Any]) -> tuple:
        p = e["problem"]
        ragged = p.get("lengths", FULL_LENGTHS) != FULL_LENGTHS
        return p["batch"] * p["heads"] * p["seq_q"] * p["seq_k"], ragged, -e["trial_id"]

    winners: dict[str, dict[str, Any]] = {}
    for e in entries:
        key = json.dumps(e["key"], sort_keys=True)
        best = winners.get(key)
        if best is None or rank(e) > rank(best):
            winners[key] = e
    for e in entries:
        winner = winners[json.dumps(e["key"], sort_keys=True)]
        e["dispatch"] = e is winner
        if e is not winner:
            e["shadowed_by"] = winner["trial_id"]
