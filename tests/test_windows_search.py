"""Sliding windows and logit softcap through the search: --window and --softcap on the command line (bad
values one line, exit 2), study names that tell such problems apart (older names unchanged), a replayed
search that stores them and the missing SDPA baselines named once, warm starts that stay within a window."""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import run_tuner
from hypothesis import given
from hypothesis import strategies as st

from tuner.backends.synthetic import write_synthetic_recording
from tuner.problem import Problem, parse_window, window_text
from tuner.search.samplers import problem_key, study_name

SHAPE = "1,2,512,256"  # D256: few wgmma variants, a quick synthetic recording
DENSE = Problem(1, 2, 512, 512, 256, causal=True)
CAPPED = Problem(1, 2, 512, 512, 256, causal=True, window_left=128, softcap=30.0)
WINDOWED = Problem(1, 2, 512, 512, 256, window_left=64, window_right=32)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('windows') / 'recording.db'}"
    write_synthetic_recording(url, [DENSE, CAPPED, WINDOWED], profile="h100", template="attn_fwd_wgmma")
    return url


def search(db: str, recording: str, *args: str):
    return run_tuner("--db", db, "search", "--gpu", "h100", "--backend", "replay", "--from", recording,
                     "--shape", SHAPE, "--trials", "3", *args)


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (("--window", "x"), "malformed window 'x'"),
    (("--window", "5,-2"), "malformed window '5,-2'"),
    (("--window", "1,2,3"), "malformed window"),
    (("--causal", "--window", "128,4"), "window_right must be 0 or -1"),
    (("--softcap", "-1"), "softcap must be 0 (off) or a positive finite number"),
    (("--softcap", "nan"), "softcap must be 0 (off)"),
])
def test_a_bad_window_or_softcap_is_one_line_and_nothing_is_written(recording, tmp_path, args, message) -> None:
    db = tmp_path / "new.db"
    result = search(f"sqlite:///{db}", recording, *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not db.exists()


@pytest.mark.parametrize("args", [("--window", "128"), ("--softcap", "30"), ("--model", "mistral-7b", "--window", "64")])
def test_window_and_softcap_need_shape_problems(tmp_path, args) -> None:
    result = run_tuner("--db", f"sqlite:///{tmp_path / 'x.db'}", "search", "--gpu", "h100", *args)
    assert result.exit_code == 2
    assert "error: --window and --softcap describe --shape problems" in result.stderr, result.stderr


def test_space_lists_the_variants_of_a_windowed_softcapped_problem() -> None:
    result = run_tuner("space", "--gpu", "h100", "--shape", SHAPE, "--causal", "--window", "128", "--softcap", "30",
                       "--format", "json")
    assert result.exit_code == 0, result.stderr
    variants = json.loads(result.stdout)
    assert variants and all((v["window_left"], v["window_right"], v["softcap"]) == (128, -1, 30.0) for v in variants)
    assert all(v["name"].endswith("_causal_wl128_sc30") for v in variants)
    # The A100's templates have windows too (the sm_80 forward since issue 39).
    sm80 = run_tuner("space", "--gpu", "a100", "--shape", SHAPE, "--window", "64", "--format", "json")
    assert sm80.exit_code == 0, sm80.stderr
    assert json.loads(sm80.stdout) and all(v["name"].endswith("_wl64") for v in json.loads(sm80.stdout))


# --- study names ---------------------------------------------------------------------------------


def test_names_of_problems_without_window_or_softcap_stay_as_they_were() -> None:
    """Stored studies are found by these names on --resume."""
    assert study_name("h100", "attn_fwd_mma", Problem(16, 16, 2048, 2048, 64)) == "h100-attn_fwd_mma-B16H16S2048S2048D64-fp16"
    assert study_name("h100", "attn_fwd_wgmma", DENSE, "energy") == "h100-attn_fwd_wgmma-B1H2S512S512D256-fp16-causal-energy"
    assert problem_key(Problem(1, 8, 64, 4096, 128, "bf16", True, 2, "paged64", "uniform:16")) == \
        "B1H8Hkv2S64S4096D128-bf16-causal-paged64-uniform16"


def test_names_tell_the_window_and_softcap() -> None:
    assert study_name("h100", "attn_fwd_wgmma", CAPPED) == "h100-attn_fwd_wgmma-B1H2S512S512D256-fp16-causal-wl128-sc30"
    assert problem_key(WINDOWED) == "B1H2S512S512D256-fp16-wl64-wr32"
    assert problem_key(Problem(1, 2, 8, 8, 64, window_right=3, softcap=2.5)) == "B1H2S8S8D64-fp16-wr3-sc2p5"
    assert problem_key(Problem(1, 2, 8, 8, 64, window_right=0)) == "B1H2S8S8D64-fp16-causal"  # right 0 is causal


_SIDE = st.integers(-1, 1 << 20)
_SOFTCAP = st.one_of(st.just(0.0), st.floats(1e-3, 1e4, allow_nan=False))


@st.composite
def _masked(draw) -> Problem:
    causal = draw(st.booleans())
    right = draw(st.sampled_from([-1, 0])) if causal else draw(_SIDE)
    return Problem(1, 2, 64, 64, 64, causal=causal, window_left=draw(_SIDE), window_right=right,
                   softcap=draw(_SOFTCAP))


@given(_masked(), _masked())
def test_study_names_differ_exactly_when_the_problems_do(a: Problem, b: Problem) -> None:
    assert (problem_key(a) == problem_key(b)) == (a == b)


@given(_masked())
def test_window_text_reads_back_as_the_same_problem(p: Problem) -> None:
    """What the label shows is what --window takes."""
    left, right = parse_window(window_text(p.window_left, p.window_right, p.causal))
    assert Problem(1, 2, 64, 64, 64, causal=p.causal, window_left=left, window_right=right, softcap=p.softcap) == p


# --- a replayed search ---------------------------------------------------------------------------


def test_a_windowed_softcapped_search_is_stored_and_shown(recording, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'out.db'}"
    result = search(db, recording, "--causal", "--window", "128", "--softcap", "30")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("no SDPA baseline: SDPA has no logit softcapping") == 1
    assert "studies h100-attn_fwd_wgmma-B1H2S512S512D256-fp16-causal-wl128-sc30" in result.stderr + result.stdout
    rows = json.loads(run_tuner("--db", db, "results", "--format", "json").stdout)
    assert rows and all(row["problem"] == CAPPED.to_dict() for row in rows)
    assert all(row["variant_name"].endswith("_causal_wl128_sc30") for row in rows)
    table = run_tuner("--db", db, "results", "--best", env={"COLUMNS": "200"}).stdout
    assert "causal window 128 softcap 30" in table


def test_a_window_has_the_sdpa_baselines_that_take_a_mask(recording, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'out.db'}"
    result = search(db, recording, "--window", "64,32", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("window 64,32: no sdpa_flash baseline") == 1
    best = json.loads(run_tuner("--db", db, "results", "--best", "--format", "json").stdout)[0]
    shown = json.loads(run_tuner("--db", db, "show", str(best["id"]), "--format", "json").stdout)
    assert {b["impl"] for b in shown["baselines"]} == {"sdpa_cudnn", "sdpa_efficient"}
    assert best["best_baseline_impl"] == "sdpa_cudnn" and math.isfinite(best["ratio_to_best_baseline"])


def test_warm_start_comes_from_a_problem_with_the_same_window_and_softcap(recording, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'out.db'}"
    assert search(db, recording, "--causal").exit_code == 0  # the dense problem of the same shape
    first = search(db, recording, "--causal", "--window", "128", "--softcap", "30")
    assert first.exit_code == 0 and "warm start" not in first.stderr, first.stderr
    again = search(db, recording, "--causal", "--window", "128", "--softcap", "30", "--study", "again")
    assert again.exit_code == 0, again.stderr
    assert "warm start from the confirmed winner of B1 H2 S512 D256 fp16 causal window 128 softcap 30" in again.stderr


def test_a_masked_variant_s_name_breaks_before_its_window_so_the_problem_keeps_its_width() -> None:
    from tuner.cli.tables import short_variant
    from tuner.kernels.variant import short_name

    name = "attn_fwd_wgmma_d128_bf16_m128n80_s2_sw32_r32_pp_p_causal_wl1023_sc30"
    shown = short_variant(name)
    assert shown == "m128n80_s2_sw32_r32_pp_p\n_causal_wl1023_sc30"
    assert shown.replace("\n", "") == short_name(name)  # joined: the name `tuner render` takes
    plain = "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal"
    assert short_variant(plain) == short_name(plain)  # causal alone stays on one line


def test_a_sampler_sunk_in_infeasible_points_is_given_a_feasible_one(recording, tmp_path) -> None:
    """Seed 21's TPE asked only infeasible points of this mostly infeasible D256 space until the search gave up
    with nothing measured; after INFEASIBLE_NUDGE of them in a row the loop now queues a feasible point."""
    db = f"sqlite:///{tmp_path / 'out.db'}"
    result = search(db, recording, "--window", "64,32", "--confirm", "0", "--seed", "21")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(run_tuner("--db", db, "results", "--format", "json").stdout)
    assert sum(row["status"] == "ok" for row in rows) >= 1
