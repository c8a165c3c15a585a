"""Bad input on the command line: one line on stderr, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_tuner

HUGE = str(2**70)


@pytest.fixture
def store_copy(replay_recording, tmp_path) -> str:
    shutil.copy(replay_recording.url.removeprefix("sqlite:///"), tmp_path / "r.db")
    return f"sqlite:///{tmp_path / 'r.db'}"


def assert_refused(result, *fragments: str) -> None:
    """Exit 2 and no traceback; the message (ours, or click's usage error) names what was wrong."""
    text = result.stderr + result.stdout
    assert result.exit_code == 2, text
    assert "Traceback" not in text and "OverflowError" not in text
    for fragment in fragments:
        assert fragment in text, text


@pytest.mark.parametrize("args, fragment", [
    (("results", "--shape", f"{HUGE},1,1,64"), "at most 2147483647"),
    (("show", HUGE), "trial_id"),
    (("results", "--limit", HUGE), "--limit"),
    (("profile", "--top", "1", "--run", HUGE), "--run"),
    (("report", "--gpu", "h200", "--out", "x", "--run", HUGE), "--run"),
])
def test_integers_beyond_64_bits_are_usage_errors(store_copy, args, fragment) -> None:
    assert_refused(run_tuner("--db", store_copy, *args), fragment)


@pytest.mark.parametrize("seed", ["-1", str(2**32), HUGE])
def test_seed_outside_32_bits_is_refused_before_anything_runs(replay_recording, tmp_path, seed) -> None:
    p = replay_recording.problem
    db = tmp_path / "new.db"
    result = run_tuner("--db", f"sqlite:///{db}", "search", "--gpu", replay_recording.profile, "--shape",
                       f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}", "--backend", "replay", "--from",
                       replay_recording.url, "--trials", "2", "--seed", seed)
    assert_refused(result, "--seed")
    assert not db.exists()


def test_an_unknown_profile_is_named_even_without_a_gpu(tmp_path) -> None:
    result = run_tuner("--db", f"sqlite:///{tmp_path / 'x.db'}", "search", "--gpu", "nosuchgpu",
                       "--shape", "1,8,512,64")
    assert_refused(result, "unknown GPU profile 'nosuchgpu'")
    assert "no usable CUDA GPU" not in result.stderr


def test_hkv_zero_is_refused_not_read_as_all_heads() -> None:
    assert_refused(run_tuner("space", "--gpu", "h100", "--shape", "1,8,512,64", "--hkv", "0"), "--hkv")


def test_a_space_with_no_feasible_variant_says_why() -> None:
    result = run_tuner("space", "--gpu", "a100", "--shape", "1,8,512,64", "--template", "attn_fwd_wgmma")
    assert_refused(result, "no variant of attn_fwd_wgmma fits", "needs compute capability 9.0+")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_paged_layout_is_the_decode_templates_and_a_wrong_page_size_is_named() -> None:
    ok = run_tuner("space", "--gpu", "h100", "--shape", "8,32,1,8192,128", "--hkv", "8", "--dtype", "bf16",
                   "--layout", "paged16", "--format", "json")
    assert ok.exit_code == 0, ok.stderr
    assert {v["template"] for v in json.loads(ok.stdout)} == {"attn_decode"}
    prefill = run_tuner("space", "--gpu", "h100", "--shape", "8,32,1,8192,128", "--layout", "paged16",
                        "--template", "attn_fwd_wgmma")
    assert_refused(prefill, "layout paged16 unsupported by attn_fwd_wgmma")
    assert_refused(run_tuner("space", "--gpu", "h100", "--shape", "8,32,1,8192,128", "--layout", "paged24"),
                   "unsupported layout 'paged24'", "paged16")


def test_no_traceback_leaves_a_store_behind_on_bad_input(tmp_path) -> None:
    for args in (("results", "--shape", f"{HUGE},1,1,64"), ("show", "0")):
        run_tuner("--db", f"sqlite:///{tmp_path / 'sub' / 'x.db'}", *args)
    assert not Path(tmp_path / "sub").exists()


def test_an_fp8_problem_on_a_template_without_e4m3_is_refused_with_the_reason() -> None:
    result = run_tuner("space", "--gpu", "h100", "--shape", "1,8,512,64", "--dtype", "e4m3",
                       "--template", "attn_fwd_mma")
    assert_refused(result, "dtype e4m3 unsupported by attn_fwd_mma")
    assert len(result.stderr.strip().splitlines()) == 1
    assert_refused(run_tuner("space", "--gpu", "h100", "--shape", "1,8,512,64", "--dtype", "fp8"),
                   "unsupported dtype 'fp8'; expected one of fp16, bf16, e4m3")
