"""Pure checks of (variant, problem, GPU profile): feasible, or not with a reason.

Runs before any compile, so infeasible points never reach nvcc or the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.dtypes import spec
from tuner.errors import TunerError
from tuner.kernels.expr import evaluate, names_in
from tuner.kernels.manifest import Manifest, load_manifest
from tuner.kernels.variant import Variant, enumerate_space, mask_of
from tuner.problem import DTYPE_BYTES, Problem
from tuner.profiles import GpuProfile

# Registers a thread needs beyond its accumulators (fragments, addresses,
# softmax state); below accumulators + this, ptxas spills in the inner loop.
_REGISTER_OVERHEAD = 40


@dataclass(frozen=True)
class Feasibility:
    ok: bool
    reason: str = ""
    smem_bytes: int = 0
    threads: int = 0

    def __bool__(self) -> bool:
        return self.ok


def expression_names(variant: Variant) -> dict[str, object]:
    """The names a manifest expression may use for this variant (elem_bytes: of a k or v element, 2 for
    fp16/bf16, 1 for e4m3 and an FP8 KV cache; kv_fp8: 1 for an FP8 KV cache with 16-bit queries; softcap: 1
    where a logit softcap is compiled in)."""
    return {**variant.params, "head_dim": variant.head_dim, "elem_bytes": DTYPE_BYTES[variant.dtype],
            "kv_fp8": int(spec(variant.dtype).fp8_kv), "causal": variant.causal, "packed": variant.packed,
            "softcap": int(variant.softcap > 0)}


def resources(variant: Variant, manifest: Manifest | None = None) -> dict[str, int]:
    """Evaluate the manifest's resource formulas (threads, smem_bytes, ...) in order."""
    manifest = manifest or load_manifest(variant.template)
    names = expression_names(variant)
    out: dict[str, int] = {}
    for key, formula in manifest.resources.items():
        out[key] = int(evaluate(formula, {**names, **out}))
    return out


def default_template(profile: GpuProfile, problems: list[Problem], candidates: list[str] | None = None) -> str:
    """The first of the profile's templates (best first; or of `candidates`) that suits every problem;
    when none suits them all, the last (most general) one."""
    names = candidates or list(profile.templates)
    for name in names:
        if all(not tunes_problem(load_manifest(name), p) for p in problems):
            return name
    return names[-1]


def tunes_problem(manifest: Manifest, problem: Problem) -> str:
    """Empty string when a search can tune the problem with the template (its pass, and supports_problem), else why
    not. The pass is checked here, not in supports_problem: a backward template's kernels are checked and built for
    the forward problem whose gradients they compute (tests, benchmarks/bwd_mma_check.py)."""
    if problem.kernel_pass != manifest.kernel_pass:
        return f"{manifest.name} is a {manifest.kernel_pass} template, not a {problem.kernel_pass} one"
    return supports_problem(manifest, problem)


def supports_problem(manifest: Manifest, problem: Problem) -> str:
    """Empty string when the template can take the problem, else why not."""
    feats = manifest.features
    if problem.head_dim not in feats.head_dims:
        return f"head dim {problem.head_dim} unsupported by {manifest.name} (supported: {list(feats.head_dims)})"
    if problem.dtype not in feats.dtypes:
        return f"dtype {problem.dtype} unsupported by {manifest.name} (supported: {list(feats.dtypes)})"
    if problem.causal and not feats.causal:
        return f"{manifest.name} has no causal masking"
    if problem.heads_kv != problem.heads and not feats.gqa:
        return f"{manifest.name} has no GQA/MQA support"
    if problem.layout not in feats.layouts:
        return f"layout {problem.layout} unsupported by {manifest.name}"
    if problem.local and not feats.windows:
        return f"{manifest.name} has no sliding windows"
    if problem.softcap and not feats.softcap:
        return f"{manifest.name} has no logit softcapping"
    if problem.ragged and not feats.seq_lens and not problem.packed:
        return f"{manifest.name} takes no per-row key lengths (lengths {problem.lengths}: a decode template does)"
    if feats.max_seq_q and problem.seq_q > feats.max_seq_q:
        return f"{manifest.name} is for queries of at most {feats.max_seq_q} rows (Sq {problem.seq_q})"
    return ""


def check(variant: Variant, problem: Problem, profile: GpuProfile) -> Feasibility:
    """Decide feasibility; the first failed rule is the reason."""
    manifest = load_manifest(variant.template)
    if (variant.head_dim, variant.dtype, variant.causal) != (problem.head_dim, problem.dtype, problem.causal):
        return Feasibility(False, "variant was built for another head dim, dtype or causality than the problem")
    if (variant.window_left, variant.window_right, variant.softcap) != mask_of(problem):
        return Feasibility(False, "variant was built for another window or softcap than the problem")
    if variant.packed != problem.packed:
        return Feasibility(False, "variant was built for packed sequences and the problem is not, or the reverse")
    why = supports_problem(manifest, problem)
    if why:
        return Feasibility(False, why)
    if tuple(profile.compute_capability) < tuple(manifest.min_compute_capability):
        cc = ".".join(map(str, manifest.min_compute_capability))
        return Feasibility(False, f"{manifest.name} needs compute capability {cc}+, {profile.name} has "
                                  f"{profile.compute_capability[0]}.{profile.compute_capability[1]}")
    if profile.nvcc_arch not in manifest.archs:
        return Feasibility(False, f"{manifest.name} is built for {', '.join(manifest.archs)}, not {profile.nvcc_arch}")
    names = expression_names(variant)
    res: dict[str, int] | None = None
    for constraint in manifest.constraints:
        # A rule may name a resource (its formula stated once, in [resources]); they are evaluated only once
        # the earlier rules hold, so a formula never meets a point they exclude (a zero divisor, say).
        if res is None and names_in(constraint.rule) & manifest.resources.keys():
            res = resources(variant, manifest)
        if not evaluate(constraint.rule, {**names, **(res or {})}):
            return Feasibility(False, constraint.reason)
    res = res if res is not None else resources(variant, manifest)
    threads, smem = res.get("threads", 0), res.get("smem_bytes", 0)
    static = res.get("static_smem_bytes", 0)  # the kernel's own __shared__ variables: dynamic + static <= opt-in
    if threads > profile.max_threads_per_block:
        return Feasibility(False, f"{threads} threads per block exceed {profile.name}'s {profile.max_threads_per_block}",
                           smem, threads)
    if smem + static > profile.smem_per_block_optin:
        what = f"{smem} B + {static} B static" if static else f"{smem} B"
        return Feasibility(False, f"shared memory {what} exceeds {profile.name}'s {profile.smem_per_block_optin} B per "
                                  f"block", smem, threads)
    blocks = res.get("min_blocks", 1)
    if blocks > 1:
        # The driver reserves 1 KiB of shared memory per resident CTA (sm_80+).
        if blocks * (smem + static + 1024) > profile.smem_per_sm:
            return Feasibility(False, f"{blocks} CTAs of {smem} B shared memory do not fit {profile.name}'s "
                                      f"{profile.smem_per_sm} B per SM", smem, threads)
        if blocks * threads > profile.max_threads_per_sm:
            return Feasibility(False, f"{blocks} CTAs of {threads} threads exceed {profile.name}'s "
                                      f"{profile.max_threads_per_sm} threads per SM", smem, threads)
        cap = min(profile.regs_per_thread, profile.regs_per_sm // (blocks * threads) // 8 * 8)
        need = res.get("accumulator_regs", 0) + _REGISTER_OVERHEAD
        if cap < need:
            return Feasibility(False, f"{blocks} CTAs per SM cap registers at {cap} per thread, below the ~{need} "
                                      f"the accumulators and addressing need", smem, threads)
    return Feasibility(True, "", smem, threads)


def feasible_space(template: str, problem: Problem, profile: GpuProfile) -> list[Variant]:
    return [v for v in enumerate_space(template, problem) if check(v, problem, profile)]


def covering_sample(template: str, problem: Problem, profile: GpuProfile, seed: int = 0) -> list[Variant]:
    """A small set of feasible variants in which every value of every parameter appears.

    Values that no feasible variant can take (for this problem and GPU) are
    skipped. Greedy: each pick covers as many not-yet-seen values as possible.
    """
    import random

    rng = random.Random(seed)
    pool = feasible_space(template, problem, profile)
    rng.shuffle(pool)
    wanted = {(p, repr(v)) for var in pool for p, v in var.params.items()}
    chosen: list[Variant] = []
    while wanted:
        best = max(pool, key=lambda var: len(wanted & {(p, repr(v)) for p, v in var.params.items()}))
        chosen.append(best)
        wanted -= {(p, repr(v)) for p, v in best.params.items()}
    return chosen


def space_report(template: str, problem: Problem, profile: GpuProfile) -> list[tuple[Variant, Feasibility]]:
    """Every variant of the template for this problem with its feasibility (feasible first)."""
    manifest = load_manifest(template)
    why = supports_problem(manifest, problem)
    if why:
        raise TunerError(why)
    report = [(v, check(v, problem, profile)) for v in enumerate_space(template, problem)]
    return sorted(report, key=lambda item: not item[1].ok)
