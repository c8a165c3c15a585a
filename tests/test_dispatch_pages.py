"""Dispatch by K/V layout (CPU): the page size and the lengths kind of a call rank the tuned entries (never
exclude them), the keys the export writes and reads back (old manifests: dense, no lengths), and export --check's
paged and ragged cells, timed in their own layout and length distribution."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.export.check_cells import check_cells, decide
from tuner.export.selection import _dispatch_key, dispatch_key, resolve_collisions
from tuner.models import DECODE
from tuner.problem import PAGE_SIZES, Problem
from tuner.runtime.shipped.dispatch import DispatchTable, Key, entry_key

# The serving batch: 7 sequences of 1-9000 keys, H32 Hkv8 D128 bf16, one query each.
DECODE_BASE = dict(batch=7, heads=32, seq_q=1, seq_k=9000, head_dim=128, dtype="bf16", heads_kv=8,
                   lengths="uniform:1")
DENSE_DECODE, PAGED_DECODE = Problem(**DECODE_BASE), Problem(**DECODE_BASE, layout="paged16")
PREFILL = Problem(1, 32, 4096, 4096, 128, dtype="bf16", heads_kv=8)


def _entries(problems: list[Problem], decode: tuple[Problem, ...] = ()) -> list[dict]:
    """Manifest entries of `problems` (kernel k<i>); those in `decode` are short-query kernels (max_seq_q 16)."""
    entries = [{"key": _dispatch_key(p), "kernel": f"k{i}", "trial_id": i, "problem": p.to_dict(),
                "problem_label": p.label, "dispatch": True, "max_seq_q": 16 if p in decode else 0}
               for i, p in enumerate(problems, start=1)]
    resolve_collisions(entries)
    return entries


def _call(page: int = 0, seq_lens: bool = False, sk: int = 9000, sq: int = 1) -> Key:
    return Key.of("bf16", 128, False, 32, 8, sq, sk, batch=7, page_size=page, seq_lens=seq_lens)


keys = st.builds(Key, st.sampled_from(["fp16", "bf16", "e4m3"]), st.sampled_from([64, 128, 256]), st.booleans(),
                 st.sampled_from([1, 2, 4, 8]), st.integers(0, 17), st.integers(0, 17), st.integers(0, 20),
                 st.sampled_from([-1, 0, 127]), st.sampled_from([-1, 64]), st.sampled_from([0.0, 30.0]),
                 st.sampled_from((0,) + PAGE_SIZES), st.booleans())


@settings(max_examples=200, deadline=None)
@given(keys)
def test_a_key_round_trips_through_the_manifest(key: Key) -> None:
    """What the export writes (an entry's or a measured cell's "key", through JSON) reads back as the same key."""
    written = json.loads(json.dumps({"key": dataclasses.asdict(key)}))
    assert entry_key(written) == key
    assert key.seq_lens or not key.page_size  # a paged key always has per-row lengths


def test_a_key_from_before_page_sizes_reads_as_dense_without_lengths() -> None:
    old = {"key": {"dtype": "bf16", "head_dim": 128, "causal": False, "group": 4, "sq_bucket": 0, "sk_bucket": 14,
                   "bh_bucket": 8}, "kernel": "old", "trial_id": 1, "dispatch": True, "max_seq_q": 16}
    assert entry_key(old).layout == (0, False)
    table = DispatchTable([old])  # an old package still serves every form of call
    for page, lens in ((0, False), (0, True), (16, True), (256, True)):
        choice = table.choose(_call(page, lens))
        assert choice.entry["kernel"] == "old" and choice.exact


@settings(max_examples=100, deadline=None)
@given(key=keys, layouts=st.lists(st.tuples(st.sampled_from((0,) + PAGE_SIZES), st.booleans()), min_size=1,
                                  max_size=5), page=st.sampled_from((0,) + PAGE_SIZES), lens=st.booleans())
def test_the_layout_ranks_but_never_excludes(key: Key, layouts: list, page: int, lens: bool) -> None:
    """Entries that differ only in page size and lengths all stay candidates of every call's layout."""
    entries = [{"key": dataclasses.asdict(dataclasses.replace(key, page_size=p, seq_lens=s)), "kernel": f"k{i}",
                "trial_id": i, "dispatch": True} for i, (p, s) in enumerate(layouts)]
    table = DispatchTable(entries)
    asked = dataclasses.replace(key, page_size=page, seq_lens=lens)
    assert {e["trial_id"] for _, e in table.ranked(asked)} == {e["trial_id"] for e in entries}
    chosen = entry_key(table.choose(asked).entry)
    same = [(p, s or bool(p)) for p, s in layouts if p == page]
    if same:  # the call's own page size wins, and among those its own lengths kind where tuned
        assert chosen.page_size == page
        assert chosen.seq_lens == asked.seq_lens or (page, asked.seq_lens) not in same


def test_a_page_16_call_runs_the_page_16_kernel_and_a_dense_call_the_dense_one() -> None:
    """The issue's case: a dense-tuned kernel ran 16-row pages at 0.71x its dense time, a page-16-tuned one within
    2% of dense. With both tuned, each form of call gets its own, page sizes between go to the nearer."""
    table = DispatchTable(_entries([DENSE_DECODE, PAGED_DECODE, PREFILL], decode=(DENSE_DECODE, PAGED_DECODE)))
    assert all(e["dispatch"] for e in table.entries)  # two keys: neither shadows the other
    served = {(page, lens): table.choose(_call(page, lens)).entry["kernel"]
              for page, lens in ((0, False), (0, True), (16, True), (32, True), (256, True))}
    assert served == {(0, False): "k1", (0, True): "k1", (16, True): "k2", (32, True): "k2", (256, True): "k1"}
    # A dense kernel tuned 3 Sk buckets nearer does not outweigh the page size (5 log2 steps from dense to 16).
    short = dataclasses.replace(DENSE_DECODE, seq_k=2048)
    table = DispatchTable(_entries([DENSE_DECODE, PAGED_DECODE, short], decode=(DENSE_DECODE, PAGED_DECODE, short)))
    assert table.choose(_call(16, sk=2048)).entry["kernel"] == "k2"
    assert table.choose(_call(0, sk=2048)).entry["kernel"] == "k3"


def test_a_dense_decode_step_takes_a_paged_decode_kernel_before_a_prefill_one() -> None:
    """Where only paged decode kernels were tuned, a dense one-query call runs one of them (the page size weighs
    like a few buckets), not a prefill kernel tuned at a dense 4096 x 4096."""
    table = DispatchTable(_entries([PAGED_DECODE, PREFILL], decode=(PAGED_DECODE,)))
    choice = table.choose(_call(0))
    assert choice.entry["kernel"] == "k1"
    assert "tuned on pages of 16 rows, not a dense K/V cache" in choice.reason
    assert table.choose(_call(0, sq=4096, sk=4096)).entry["kernel"] == "k2"


def test_full_and_ragged_kernels_of_one_shape_each_serve_their_own_calls() -> None:
    """A kernel tuned at full lengths and one tuned on a ragged batch of the same shape have different keys: both
    ship; calls with seq_lens run the ragged one, calls without the other (1-2% apart: it only breaks ties)."""
    full = dataclasses.replace(DENSE_DECODE, lengths="full")
    table = DispatchTable(_entries([full, DENSE_DECODE], decode=(full, DENSE_DECODE)))
    assert all(e["dispatch"] for e in table.entries)
    assert table.choose(_call(0, False)).entry["kernel"] == "k1"
    assert table.choose(_call(0, True)).entry["kernel"] == "k2"
    assert "tuned without per-row key lengths, and this call has them" in \
        DispatchTable(_entries([full, PREFILL], decode=(full,))).choose(_call(0, True)).reason


def test_a_paged_key_prefers_a_ragged_batch_at_equal_size() -> None:
    """Paged problems of one shape share a key whatever their lengths (a paged call always passes them): the one
    tuned on a ragged batch ships, as serving engines' batches are."""
    paged_full = dataclasses.replace(PAGED_DECODE, lengths="full")
    entries = _entries([paged_full, PAGED_DECODE], decode=(paged_full, PAGED_DECODE))
    assert [e["dispatch"] for e in entries] == [False, True] and entries[0]["shadowed_by"] == 2


def test_labels_and_reasons_name_the_layout() -> None:
    assert _call(16).label().endswith(", in pages of 16 rows, with per-row key lengths")
    assert _call(0, True).label().endswith(", with per-row key lengths")
    assert "page" not in _call(0).label() and "lengths" not in _call(0).label()
    table = DispatchTable(_entries([DENSE_DECODE, PAGED_DECODE], decode=(DENSE_DECODE, PAGED_DECODE)))
    assert "tuned on" not in table.choose(_call(16)).reason  # its own layout: nothing to say
    only_dense = DispatchTable(_entries([DENSE_DECODE], decode=(DENSE_DECODE,)))
    assert "tuned on a dense K/V cache, not pages of 16 rows" in only_dense.choose(_call(16)).reason


def test_the_exported_key_holds_the_problems_layout() -> None:
    assert dispatch_key(PAGED_DECODE).layout == (16, True)
    assert dispatch_key(dataclasses.replace(PAGED_DECODE, lengths="full")).layout == (16, True)
    assert dispatch_key(DENSE_DECODE).layout == (0, True)
    assert dispatch_key(PREFILL).layout == (0, False)


# --- export --check: paged and ragged cells ------------------------------------------------------


def test_a_paged_kind_is_checked_in_its_layout() -> None:
    """The tuned paged problem and its decode steps are paged cells (page-16 candidates first); its prefill
    batches are dense at full lengths (only decode kernels read pages: longer paged queries run SDPA anyway)."""
    cells = check_cells(_entries([DENSE_DECODE, PAGED_DECODE, PREFILL], decode=(DENSE_DECODE, PAGED_DECODE)))
    assert len({c.key for c in cells}) == len(cells)
    for cell in cells:
        assert cell.key == dispatch_key(cell.problem)
    paged = [c for c in cells if c.key.page_size]
    assert paged[0].problem == PAGED_DECODE
    assert {c.problem.layout for c in paged} == {"paged16"} and len(paged) == 1 + len(DECODE)
    assert all(c.candidates[0]["kernel"] == "k2" for c in paged)
    assert {e["kernel"] for c in paged for e in c.candidates} >= {"k1", "k2"}  # the dense-tuned one is timed too
    prefill = [c for c in cells if c.problem.seq_q > 16]
    assert prefill and all(c.key.layout == (0, False) and c.problem.layout == "bhsd" for c in prefill)


def test_a_ragged_kinds_decode_steps_keep_its_length_distribution() -> None:
    """A dense ragged kind's decode steps are measured with its distribution (scaled to each context) for calls
    with seq_lens, and at full lengths for calls without; a paged kind's only paged (its calls always have them)."""
    ragged = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8, lengths="uniform:2048")
    cells = check_cells(_entries([ragged], decode=(ragged,)))
    decode = {(c.problem.batch, c.problem.seq_q, c.problem.seq_k, c.key.seq_lens): c.problem
              for c in cells if c.problem.seq_q <= 16}
    assert len(decode) == 2 * len(DECODE)
    assert decode[(8, 1, 8192, True)] == ragged  # the tuned problem itself, not at full lengths
    assert decode[(64, 1, 1024, True)].lengths == "uniform:256"
    assert decode[(1, 1, 32768, True)].lengths == "uniform:8192"
    assert decode[(8, 1, 8192, False)] == dataclasses.replace(ragged, lengths="full")
    paged = check_cells(_entries([PAGED_DECODE], decode=(PAGED_DECODE,)))
    assert all(c.key.page_size == 16 for c in paged)


def test_a_measured_paged_cell_round_trips_and_decides_only_its_key() -> None:
    entries = _entries([DENSE_DECODE, PAGED_DECODE], decode=(DENSE_DECODE, PAGED_DECODE))
    cell = next(c for c in check_cells(entries) if c.key.page_size and c.problem == PAGED_DECODE)
    record = decide(cell, {"k1": 1.3, "k2": 1.2}, {"sdpa_cudnn": 40.0}, {}, {"k1": 30.0, "k2": 33.0})
    record = json.loads(json.dumps(record))  # as manifest.json holds it
    assert entry_key(record) == cell.key and record["problem"]["layout"] == "paged16"
    table = DispatchTable(entries, [record])
    measured = table.choose(_call(16))
    assert measured.cell is not None and measured.entry["kernel"] == "k1"  # the check measured k1 faster there
    assert table.choose(_call(0)).cell is None  # a dense call is another cell


# --- export --check's inputs and fallback of a paged cell (CPU stand-ins for the GPU pieces) -------------


@pytest.fixture
def fake_package(monkeypatch):
    """A package module whose _runtime is the shipped runtime (paged.py) with kernels stubbed per test."""
    from tuner.runtime.shipped import launcher, paged

    pkg = types.ModuleType("pagedpkg")
    pkg.AttentionInputError = launcher.AttentionInputError
    kernels = types.ModuleType("pagedpkg._runtime.kernels")
    monkeypatch.setitem(sys.modules, "pagedpkg", pkg)
    monkeypatch.setitem(sys.modules, "pagedpkg._runtime.paged", paged)
    monkeypatch.setitem(sys.modules, "pagedpkg._runtime.kernels", kernels)
    return pkg, kernels


def test_a_paged_cells_kernels_run_on_its_pages_and_lengths(fake_package) -> None:
    """cell_inputs gives the paged launch (cache, table and the batch's key lengths, as the search's kernel_call
    takes them); a kernel that reads every key instead of each row's own fails the check's verification."""
    from tuner.export import check
    from tuner.export.check_cells import CheckCell
    from tuner.runtime.shipped.paged import gather_pages
    from tuner.runtime.verify import problem_reference

    pkg, kernels = fake_package
    problem = Problem(3, 8, 1, 100, 64, dtype="bf16", heads_kv=2, layout="paged16", lengths="uniform:5")
    data, ref = check.cell_inputs(problem, "cpu")
    assert data["seq_lens"].tolist() == list(problem.key_lengths())
    assert data["k_cache"].shape[1:] == (16, 2, 64) and data["block_table"].shape == (3, 7)
    launches = []

    class Kernel:
        def __init__(self, own_lengths: bool) -> None:
            self.own = own_lengths

        def paged(self, q, kc, vc, out, table, lens, scale=None, check=True, descales=None):
            launches.append(check)
            k, v = (gather_pages(c, table)[:, :, :problem.seq_k] for c in (kc, vc))
            used = lens.tolist() if self.own else None
            out.copy_(problem_reference(problem, q.float(), k.float(), v.float(), key_lengths=used)[0])

    fakes = {"own": Kernel(True), "every_key": Kernel(False)}
    kernels.load_kernel = lambda name, device: fakes[name]
    cell = CheckCell(problem, dispatch_key(problem), ({"kernel": "own"}, {"kernel": "every_key"}))
    errors: dict[str, str] = {}
    runs = check._kernel_runs(pkg, cell, data, ref, errors)
    assert list(runs) == ["own"] and errors["every_key"].startswith("relative error")
    runs["own"]()
    assert launches == [True, True, False]  # two checked verifications, then the timed launch unchecked


def test_a_paged_cells_fallback_gathers_the_pages_in_each_call(fake_package) -> None:
    """What a routed paged cell runs, as the package runs it: the pages gathered into a dense copy, then SDPA; the
    gather is part of each timed call."""
    import torch

    from tuner.export import check, check_paged
    from tuner.runtime.baselines import Baseline

    pkg, _ = fake_package
    problem = Problem(2, 4, 1, 40, 64, dtype="bf16", heads_kv=2, layout="paged16")
    data, _ = check.cell_inputs(problem, "cpu")
    (k, v), gather = check_paged.gathered(pkg, data, problem.seq_k)
    assert torch.equal(k, data["k"]) and torch.equal(v, data["v"])  # the dense values, read from the pages
    seen = []
    (wrapped,) = check_paged.preceded([Baseline("sdpa_x", lambda: seen.append(k.float().sum().item()), None)],
                                      gather)
    data["k_cache"].zero_()
    wrapped.call()
    assert seen == [0.0] and wrapped.name == "sdpa_x"  # gathered again before the baseline ran


# --- an exported package (the export recompiles cubins: nvcc) ---------------------------------------------


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")


def _export(tmp_path, prefix: str, change) -> types.ModuleType:
    """A package of tests/test_export.py's store, its manifest.json changed by `change` before the import."""
    from tests.cli_helpers import run_tuner
    from tests.test_export import _unique, import_exported, reseal, write_export_store

    store = write_export_store(f"sqlite:///{tmp_path / 'r.db'}")
    name = _unique(prefix)
    res = run_tuner("--db", store.url, "export", "--gpu", "h100", "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    path = tmp_path / name / name / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    reseal(path.parent)  # past the hash check, to the runtime's reading of the manifest
    return import_exported(tmp_path / name, name)


def _decode_tensors(page: int = 0):
    """Meta tensors of a decode step, B8 H8 D64 fp16 at 8192 keys: dense k, v, or a page cache with its table."""
    import torch

    q = torch.empty(8, 8, 1, 64, dtype=torch.float16, device="meta")
    lens = torch.empty(8, dtype=torch.int32, device="meta")
    if not page:
        kv = torch.empty(8, 8, 8192, 64, dtype=torch.float16, device="meta")
        return q, kv, lens, None
    cache = torch.empty(8 * 8192 // page, page, 8, 64, dtype=torch.float16, device="meta")
    return q, cache, lens, torch.empty(8, 8192 // page, dtype=torch.int32, device="meta")


@needs_nvcc
def test_a_package_runs_a_page_16_call_on_its_page_16_entry(tmp_path) -> None:
    """A package with a dense-tuned and a page-16-tuned decode entry: a paged call with 16-row pages dispatches to
    the page-16 one, a dense call (with or without seq_lens) to the dense one, and explain() says so."""
    def add_decode_entries(manifest: dict) -> None:
        base = manifest["entries"][0]
        for trial, page in ((901, 0), (902, 16)):
            key = Key.of("fp16", 64, False, 8, 8, 1, 8192, batch=8, page_size=page, seq_lens=bool(page))
            manifest["entries"].append({**base, "key": dataclasses.asdict(key), "trial_id": trial, "max_seq_q": 16,
                                        "dispatch": True, "route": None, "problem_label": f"decode {page}"})

    mod = _export(tmp_path, "pages", add_decode_entries)
    q, cache, lens, table = _decode_tensors(16)
    paged = mod.explain(q, cache, cache, seq_lens=lens, block_table=table)
    assert paged.trial_id == 902 and paged.exact
    assert "in pages of 16 rows, with per-row key lengths" in str(paged) and "tuned on" not in paged.reason
    assert "only decode kernels read them" in str(paged)  # the entry's kernel here is a prefill one: SDPA runs
    q, kv, lens, _ = _decode_tensors()
    assert mod.explain(q, kv, kv).trial_id == 901
    ragged = mod.explain(q, kv, kv, seq_lens=lens)
    assert ragged.trial_id == 901 and "tuned without per-row key lengths, and this call has them" in ragged.reason
    q, cache, lens, table = _decode_tensors(32)
    assert mod.explain(q, cache, cache, seq_lens=lens, block_table=table).trial_id == 902  # the nearer page size


@needs_nvcc
def test_a_package_from_before_page_sizes_still_dispatches(tmp_path) -> None:
    """Manifest keys without page_size and seq_lens (an older export) load and serve every form of call, as
    dense entries without lengths."""
    def strip(manifest: dict) -> None:
        for entry in manifest["entries"]:
            del entry["key"]["page_size"], entry["key"]["seq_lens"]

    mod = _export(tmp_path, "oldkeys", strip)
    import torch

    q = torch.empty(2, 8, 2048, 64, dtype=torch.float16, device="meta")
    dense = mod.explain(q, q, q)
    assert dense.kernel is not None and dense.exact and "page" not in dense.reason
    q, cache, lens, table = _decode_tensors(16)
    paged = mod.explain(q, cache, cache, seq_lens=lens, block_table=table)
    assert paged.kernel is not None and "tuned on a dense K/V cache, not pages of 16 rows" in paged.reason
