"""tuner export --check without a GPU: which cells it measures, what it decides from timings, and how a
package with measured cells dispatches and explains itself. The timing itself is a GPU test
(tests/gpu/test_export_gpu.py)."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_tuner
from tests.test_export import _unique, import_exported, reseal, write_export_store
from tuner.export.check_cells import (
    MAX_CANDIDATES,
    PREFILL_LENGTHS,
    cell_line,
    check_cells,
    decide,
    median_ratios,
)
from tuner.export.selection import _dispatch_key, resolve_collisions
from tuner.runtime.shipped.dispatch import DispatchTable, Key
from tuner.models import DECODE
from tuner.problem import Problem

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")


def _entries(problems: list[Problem]) -> list[dict]:
    entries = [{"key": _dispatch_key(p), "kernel": f"k{i % 5}", "trial_id": i, "problem": p.to_dict(),
                "problem_label": p.label, "dispatch": True} for i, p in enumerate(problems, start=1)]
    resolve_collisions(entries)
    return entries


def _key(p: Problem) -> Key:
    return Key.of(p.dtype, p.head_dim, p.causal, p.heads, p.heads_kv, p.seq_q, p.seq_k, batch=p.batch,
                  page_size=p.page_size, seq_lens=p.ragged)


problems = st.builds(
    lambda b, hkv, g, s, d, dt, c, kv: Problem(b, hkv * g, s, s, d, dtype=dt, causal=c, heads_kv=hkv, layout=kv[0],
                                               lengths=kv[1]),
    st.integers(1, 32), st.sampled_from([1, 2, 8]), st.sampled_from([1, 4]), st.integers(1, 20000),
    st.sampled_from([64, 128]), st.sampled_from(["fp16", "bf16", "e4m3", "bf16_kv_e4m3"]), st.booleans(),
    st.sampled_from([("bhsd", "full"), ("bhsd", "uniform:1"), ("paged16", "full"), ("paged32", "uniform:1")]))


@settings(max_examples=60, deadline=None)
@given(st.lists(problems, min_size=1, max_size=6))
def test_cells_cover_every_tuned_problem_and_the_serving_shapes(tuned: list[Problem]) -> None:
    """Every tuned problem's key and every prefill/decode serving shape of its model is a cell, once (the decode
    steps in the tuned K/V layout and lengths kind, a dense kind's at full lengths too, the prefill batches dense at
    full lengths); a cell's
    candidates are distinct kernels of its dtype/head dim/causality, the rule's choice first."""
    entries = _entries(tuned)
    cells = check_cells(entries)
    keys = [c.key for c in cells]
    assert len(keys) == len(set(keys))
    table = DispatchTable(entries)
    for tp in (Problem.from_dict(e["problem"]) for e in table.entries):
        assert _key(tp) in keys
        for s in PREFILL_LENGTHS:
            assert _key(Problem(max(1, 16384 // s), tp.heads, s, s, tp.head_dim, dtype=tp.dtype, causal=tp.causal,
                                heads_kv=tp.heads_kv)) in keys
        kinds = {tp.lengths, tp.lengths if tp.page_size else "full"}  # a dense kind's decode steps: both kinds
        for (b, sq, ctx), lengths in itertools.product(DECODE, kinds):
            assert _key(Problem(b, tp.heads, sq, ctx, tp.head_dim, dtype=tp.dtype, causal=tp.causal,
                                heads_kv=tp.heads_kv, layout=tp.layout, lengths=lengths)) in keys
    for cell in cells:
        assert cell.key == _key(cell.problem)
        kernels = [e["kernel"] for e in cell.candidates]
        assert 1 <= len(kernels) <= MAX_CANDIDATES and len(set(kernels)) == len(kernels)
        # A candidate has the cell's dtype, head dim and causality (one query: either causality, the same sums).
        for e in cell.candidates:
            dt, d, causal = _key(Problem.from_dict(e["problem"])).features
            assert (dt, d) == cell.key.features[:2] and (causal == cell.key.causal or cell.key.sq_bucket == 0)
        assert cell.candidates[0]["kernel"] == table.choose(cell.key).entry["kernel"]


def test_tuned_problems_come_first() -> None:
    tuned = [Problem(4, 32, 4096, 4096, 128, dtype="bf16", causal=True, heads_kv=8), Problem(16, 16, 2048, 2048, 64)]
    cells = check_cells(_entries(tuned))
    assert [c.problem for c in cells[:2]] == tuned
    decode = [c for c in cells if c.problem.seq_q <= 16]
    assert len(decode) == 2 * len(DECODE)


def test_median_ratio_is_taken_per_round_against_the_best_backend_of_that_round() -> None:
    # µs per round (interleaved_rounds): per-round ratios to the best backend 0.90, 1.20, 1.01
    times = {"k": [100.0, 80.0, 100.0], "flash": [110.0, 100.0, 101.0], "cudnn": [90.0, 96.0, 200.0]}
    assert median_ratios(times, ["k"], ["flash", "cudnn"]) == pytest.approx({"k": 1.01})


def _cell():
    tuned = [Problem(4, 16, 2048, 2048, 64), Problem(16, 16, 512, 512, 64)]
    entries = _entries(tuned)
    entries[1]["kernel"] = "other"
    return check_cells(entries)[0]


@pytest.mark.parametrize("ratios, errors, route, kernel", [
    ({"k1": 1.10, "other": 1.20}, {}, "kernel", "other"),       # the fastest verified kernel, even not the rule's
    ({"k1": 0.97, "other": 0.90}, {}, "sdpa", "k1"),            # every kernel loses by more than 2%: SDPA
    ({"k1": 0.985}, {"other": "relative error 1e-1 >= 0.002"}, "kernel", "k1"),  # within 2%: keep the kernel
    ({}, {"k1": "does not take the shape", "other": "wrong"}, "sdpa", None),   # nothing verified: SDPA
])
def test_decide_keeps_the_fastest_verified_kernel_unless_sdpa_beats_it(ratios, errors, route, kernel) -> None:
    cell = _cell()
    record = decide(cell, ratios, {"sdpa_flash": 50.0, "sdpa_cudnn": 45.0}, errors, {n: 40.0 for n in ratios})
    assert record["route"] == route and record["kernel"] == kernel
    assert record["sdpa_impl"] == "sdpa_cudnn" and record["sdpa_us"] == 45.0
    assert record["key"] == dict(cell.key.__dict__)
    assert {c["kernel"]: c["error"] for c in record["candidates"]} == {e["kernel"]: errors.get(e["kernel"])
                                                                        for e in cell.candidates}
    if kernel:  # the entry recorded is one that shipped the chosen kernel
        assert next(e for e in cell.candidates if e["trial_id"] == record["trial_id"])["kernel"] == kernel
    assert ("-> SDPA" in cell_line(record)) == (route == "sdpa")


def test_with_no_sdpa_backend_a_verified_kernel_keeps_the_cell() -> None:
    record = decide(_cell(), {"k1": 1.0}, {}, {}, {"k1": 40.0})
    assert record["route"] == "kernel" and record["sdpa_impl"] is None


def test_a_measured_cell_decides_its_key_and_others_keep_the_rule() -> None:
    large, small = Problem(16, 16, 2048, 2048, 64), Problem(3, 12, 1536, 1536, 64)
    entries = _entries([large, small])
    entries[0]["kernel"], entries[1]["kernel"] = "large", "small"
    asked = Key.of("fp16", 64, False, 16, 16, 2048, 2048, batch=16)
    decode = Key.of("fp16", 64, False, 16, 16, 1, 8192, batch=8)
    cells = [dict(key=dict(asked.__dict__), route="kernel", trial_id=2, kernel="small", ratio=1.05,
                  sdpa_impl="sdpa_cudnn", problem_label="B16 H16 S2048 D64 fp16"),
             dict(key=dict(decode.__dict__), route="sdpa", trial_id=1, kernel="large", ratio=0.55,
                  sdpa_impl="sdpa_flash", problem_label="B8 H16 Sq1 Sk8192 D64 fp16")]
    table = DispatchTable(entries, cells)
    chosen = table.choose(asked)
    assert chosen.entry["kernel"] == "small" and chosen.route is None and "export --check" in chosen.reason
    routed = table.choose(decode)
    assert routed.route == "sdpa"
    other = table.choose(Key.of("fp16", 64, False, 16, 16, 4096, 4096, batch=16))
    assert other.cell is None and other.entry["kernel"] == "large"
    # A cell naming a trial the package does not hold is ignored (the rule decides).
    assert DispatchTable(entries, [dict(cells[0], trial_id=99)]).choose(asked).entry["kernel"] == "large"


def test_a_checked_entry_overrides_the_entrys_own_route() -> None:
    """The search found the kernel slower on its tuned problem (route 'sdpa'); the check measured it faster
    on this key: the measurement of the key wins."""
    entries = _entries([Problem(4, 16, 2048, 2048, 64)])
    entries[0]["route"] = "sdpa"
    key = Key.of("fp16", 64, False, 16, 16, 2048, 2048, batch=4)
    cell = dict(key=dict(key.__dict__), route="kernel", trial_id=1, kernel="k1", ratio=1.01, sdpa_impl="sdpa_cudnn",
                problem_label="B4 H16 S2048 D64 fp16")
    assert DispatchTable(entries).choose(key).route == "sdpa"
    assert DispatchTable(entries, [cell]).choose(key).route is None


@needs_nvcc
def test_a_package_explains_its_measured_cells(tmp_path) -> None:
    """A package whose manifest.json holds measured cells (as --check writes them) follows them and
    explain() shows the measurement; keys without a cell keep the nearest-bucket rule."""
    import torch

    store = write_export_store(f"sqlite:///{tmp_path / 'r.db'}")
    name = _unique("checked")
    res = run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    path = tmp_path / name / name / "manifest.json"
    manifest = json.loads(path.read_text())
    big = next(e for e in manifest["entries"] if e["trial_id"] == store.trial_ids["big"])
    decode = Key.of("fp16", 64, False, 8, 8, 1, 8192, batch=2)
    manifest["checked"] = {"gpu_name": "NVIDIA H100 80GB HBM3", "cells": [
        dict(key=dict(decode.__dict__), route="sdpa", trial_id=big["trial_id"], kernel=big["kernel"], ratio=0.55,
             sdpa_impl="sdpa_flash", problem_label="B2 H8 Sq1 Sk8192 D64 fp16")]}
    path.write_text(json.dumps(manifest))
    reseal(path.parent)  # as export --check seals what it records
    mod = import_exported(tmp_path / name, name)
    q = torch.empty(2, 8, 1, 64, dtype=torch.float16, device="meta")
    kv = torch.empty(2, 8, 8192, 64, dtype=torch.float16, device="meta")
    text = str(mod.explain(q, kv, kv))
    assert "checked on NVIDIA H100 80GB HBM3 by `tuner export --check`" in text
    assert f"routed to SDPA at B2 H8 Sq1 Sk8192 D64 fp16 (best kernel: {big['kernel']} 0.55x sdpa_flash)" in text
    other = torch.empty(2, 8, 2048, 64, dtype=torch.float16, device="meta")
    assert "export --check" not in str(mod.explain(other, other, other))


@needs_nvcc
def test_check_needs_a_package_and_a_gpu(tmp_path) -> None:
    store = write_export_store(f"sqlite:///{tmp_path / 'r.db'}")
    res = run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "h"), "--format", "header",
                    "--check")
    assert res.exit_code == 2 and "--check measures an importable package" in res.stderr
    assert not (tmp_path / "h").exists()
    import torch

    if not torch.cuda.is_available():
        res = run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "p"), "--check")
        assert res.exit_code == 2 and "no CUDA device is visible" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


@needs_nvcc
def test_a_failed_check_is_one_line_and_leaves_the_manifest_as_it_was(tmp_path, monkeypatch) -> None:
    """The cells are measured in a child process; when it fails (here: no GPU to load a kernel on) the
    export says so in one line and manifest.json keeps what the export wrote."""
    import tuner.export.check as check
    from tuner.errors import TunerError
    from tuner.profiles import load_profile

    store = write_export_store(f"sqlite:///{tmp_path / 'r.db'}")
    name = _unique("failcheck")
    res = run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    manifest = tmp_path / name / name / "manifest.json"
    before = manifest.read_bytes()
    monkeypatch.setattr(check, "require_gpu_for", lambda profile: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the child sees no GPU whatever this machine has
    with pytest.raises(TunerError, match=f"export --check failed while measuring the cells of {name}: ") as err:
        check.check_package(tmp_path / name, name, load_profile("h100"))
    assert "\n" not in str(err.value)
    assert manifest.read_bytes() == before


@needs_nvcc
def test_export_force_check_replaces_the_earlier_package_only_once_the_check_passed(tmp_path, monkeypatch) -> None:
    """--force --check measures the new package staged beside the earlier one: a check that fails (or is
    interrupted) leaves the earlier package as it was, one that passes swaps the checked package in."""
    import json

    import tuner.export.check as check
    from tuner.errors import TunerError
    from tuner.export.run import ExportOptions, export

    store = write_export_store(f"sqlite:///{tmp_path / 'r.db'}")
    name = _unique("forcecheck")
    out = tmp_path / name
    assert run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(out)).exit_code == 0
    earlier = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    options = ExportOptions(gpu="h100", out=out, db_url=store.url, force=True, check=True, name=name)
    monkeypatch.setattr(check, "require_gpu_for", lambda profile: 0)
    seen = []

    def failing(root, pkg, profile, progress):
        seen.append(root)
        raise TunerError(f"export --check failed while measuring the cells of {pkg}: (test)")

    monkeypatch.setattr(check, "check_package", failing)
    with pytest.raises(TunerError, match="export --check failed"):
        export(options)
    assert seen and seen[0] != out and seen[0].parent == out  # measured where it was staged, not in place
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == earlier

    def passing(root, pkg, profile, progress):
        path = root / pkg / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "checked": {"cells": ["measured"]}}))
        return ["measured"]

    monkeypatch.setattr(check, "check_package", passing)
    assert export(options).checked == ["measured"]
    assert json.loads((out / name / "manifest.json").read_text())["checked"] == {"cells": ["measured"]}
    assert not [p for p in out.iterdir() if p.name.startswith(".tuner-")]


def test_a_short_query_kernel_never_serves_long_queries() -> None:
    """A decode kernel (its template's max_seq_q 16) computes any Sq but slowly: dispatch gives it queries
    of up to 16 rows and sends longer ones to a prefill kernel, however near the decode entry's bucket."""
    decode, prefill = Problem(8, 32, 1, 8192, 128, heads_kv=8), Problem(1, 32, 4096, 4096, 128, heads_kv=8)
    entries = _entries([decode, prefill])
    entries[0].update(kernel="decode", max_seq_q=16)
    entries[1].update(kernel="prefill", max_seq_q=0)
    table = DispatchTable(entries)

    def served(sq: int) -> str:
        return table.choose(Key.of("fp16", 128, False, 32, 8, sq, 8192, batch=8)).entry["kernel"]

    assert [served(sq) for sq in (1, 4, 16)] == ["decode"] * 3
    assert [served(sq) for sq in (17, 32, 512)] == ["prefill"] * 3
    only_decode = DispatchTable(entries[:1])
    long_query = Key.of("fp16", 128, False, 32, 8, 64, 8192)
    assert only_decode.choose(long_query) is None
    assert "queries of more than 16 rows are not supported" in only_decode.unsupported_reason(long_query)
