"""A variant's resource formulas are stated once, in its manifest's [resources]: constraints refer to them by
name, and the template's config constants (SMEM_BYTES, THREADS, CONSUMER_REGS, ...) are checked against them.

The nvcc test compiles, per template, one file of static_asserts (the ones render() writes) over a random
sample of its feasible variants: the Python formula and the C++ constant agree across the space, not only
at the variants a search happened to build.
"""

from __future__ import annotations

import itertools
import random

import pytest

from tests.kernel_builds import needs_nvcc
from tuner.kernels.compiler import compile_source
from tuner.kernels.expr import names_in
from tuner.kernels.feasibility import check, resources
from tuner.kernels.manifest import list_templates, load_manifest
from tuner.kernels.render import config_type, resource_asserts
from tuner.kernels.variant import Variant, enumerate_space
from tuner.problem import Problem
from tuner.profiles import GpuProfile, load_profile

TEMPLATES = sorted(m.name for m in list_templates())
SAMPLE = 60  # variants per template: one compile each, a few seconds


def _profile(arch: str) -> GpuProfile:
    return load_profile("h100" if arch.startswith("sm_90") else "a100")


def _feasible_sample(template: str, count: int, seed: int = 0) -> list[Variant]:
    """`count` feasible variants drawn from every (head dim, dtype, causal) the template takes."""
    manifest = load_manifest(template)
    profile = _profile(manifest.archs[0])
    rng = random.Random(seed)
    pool: list[Variant] = []
    feats = manifest.features
    for head_dim, dtype, causal in itertools.product(feats.head_dims, feats.dtypes, (False, True)[: 1 + feats.causal]):
        problem = Problem(1, 8, 1 if feats.max_seq_q else 1024, 1024, head_dim, dtype, causal)
        space = [v for v in enumerate_space(template, problem) if check(v, problem, profile)]
        pool += rng.sample(space, min(len(space), max(1, count // 8)))
    return rng.sample(pool, min(count, len(pool)))


def test_the_register_budget_is_stated_once_and_named_by_the_rule() -> None:
    """The Hopper template's register rule names consumer_regs instead of restating its formula."""
    manifest = load_manifest("attn_fwd_wgmma")
    budget = [c.rule for c in manifest.constraints if "consumer_regs" in names_in(c.rule)]
    assert len(budget) == 1 and "65536" not in budget[0]
    assert "65536" in manifest.resources["consumer_regs"]


@pytest.mark.parametrize("template", ["attn_fwd_mma", "attn_decode", "attn_decode_sm80"])
def test_the_accumulator_rule_names_its_resource(template: str) -> None:
    manifest = load_manifest(template)
    assert any(names_in(c.rule) == {"accumulator_regs"} for c in manifest.constraints)


def test_a_rule_that_names_a_resource_sees_its_value() -> None:
    """The rule and the resource it names agree at every sampled point (the rule is evaluated on the value)."""
    for variant in _feasible_sample("attn_fwd_wgmma", 40):
        res = resources(variant)
        assert variant.params["BLOCK_N"] // 2 + variant.head_dim // 2 + 32 <= res["consumer_regs"] <= 240


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("template", TEMPLATES)
def test_python_formulas_equal_the_config_constants(template: str) -> None:
    manifest = load_manifest(template)
    lines = [manifest.source, "\n// ---- the manifest's resources against the config, per sampled variant\n"]
    for index, variant in enumerate(_feasible_sample(template, SAMPLE)):
        lines.append(f"using Cfg{index} = {config_type(variant)};  // {variant.name}\n")
        lines.append(resource_asserts(resources(variant, manifest), f"Cfg{index}"))
    result = compile_source("".join(lines), f"{template}_resources", manifest.archs[0], use_cache=False)
    assert result.ok, result.log[-3000:]
