"""The decode template (flash-decoding across a cluster) on a real sm_90 GPU: every output element and lse
right for short queries over short and long contexts, GQA packing, causal, BSHD, poisoned outputs."""

from __future__ import annotations

import pytest

from tests.gpu.reference_checks import assert_sanitizer_clean, assert_variants_match_reference, sample_variants
from tuner.problem import Problem

pytestmark = pytest.mark.gpu
# The sm_80 template (cp.async, splits merged through a workspace) runs on sm_90 too: tested here.
TEMPLATES = ["attn_decode", "attn_decode_sm80"]

PROBLEMS = [
    Problem(2, 32, 1, 8192, 128, dtype="bf16", heads_kv=8),                # the decode step: GQA 4
    Problem(3, 8, 1, 1, 64),                                               # one key
    Problem(2, 8, 2, 17, 64, causal=True, heads_kv=1),                     # MQA (group 8), causal, tails
    Problem(1, 16, 4, 1000, 128, dtype="bf16", causal=True, heads_kv=4),   # speculative verify: Sq 4
    Problem(2, 4, 16, 1000, 64, heads_kv=4),                               # group 1, Sq 16
    Problem(1, 32, 16, 2000, 128, dtype="bf16", causal=True, heads_kv=8),  # 64 rows per block, causal
    Problem(1, 8, 1, 65536, 128, dtype="bf16", heads_kv=2),                # a long context
    Problem(2, 8, 3, 777, 128, causal=True, heads_kv=2, layout="bshd"),    # BSHD strides
    Problem(1, 4, 20, 10, 64, causal=True),                                # Sq > Sk: rows that see no key
    # Sliding windows (tiles left of the window never loaded) and softcap.
    Problem(2, 32, 1, 8192, 128, dtype="bf16", causal=True, heads_kv=8, window_left=4095),  # Mistral's decode
    Problem(1, 16, 4, 3000, 128, dtype="bf16", causal=True, heads_kv=4, window_left=1000, softcap=50.0),
    Problem(2, 8, 16, 2000, 64, heads_kv=2, window_left=64, window_right=8),  # both sides, no causality
    Problem(3, 8, 1, 700, 64, heads_kv=1, softcap=5.0),                    # strong capping, MQA
]


# An FP8 KV cache (e4m3 k and v with scales per batch row and K/V head; sm_90 template only).
FP8_CACHE_PROBLEMS = [
    Problem(2, 32, 1, 8192, 128, dtype="bf16_kv_e4m3", heads_kv=8),                 # the decode step
    Problem(1, 16, 4, 1000, 128, dtype="fp16_kv_e4m3", causal=True, heads_kv=4),     # Sq 4, fp16 queries
    Problem(2, 8, 3, 777, 128, dtype="bf16_kv_e4m3", causal=True, heads_kv=2, layout="bshd"),
    Problem(1, 8, 16, 2000, 128, dtype="fp16_kv_e4m3", heads_kv=8),                  # group 1, Sq 16
    Problem(1, 16, 4, 3000, 128, dtype="bf16_kv_e4m3", causal=True, heads_kv=4, window_left=1000, softcap=50.0),
    Problem(1, 8, 1, 65536, 128, dtype="bf16_kv_e4m3", heads_kv=2),                  # a long context
    Problem(1, 4, 20, 10, 128, dtype="bf16_kv_e4m3", causal=True),                   # rows that see no key
]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_variants_match_fp32_reference(problem: Problem, template: str, hopper) -> None:
    assert_variants_match_reference(sample_variants(template, problem, hopper), problem, hopper)


@pytest.mark.parametrize("problem", FP8_CACHE_PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_fp8_cache_variants_match_fp32_reference_of_the_real_values(problem: Problem, hopper) -> None:
    assert_variants_match_reference(sample_variants("attn_decode", problem, hopper), problem, hopper)


@pytest.mark.parametrize("case", ["decode", "decode_sm80"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_clean(tool: str, case: str, hopper) -> None:
    assert_sanitizer_clean(tool, case)


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("causal, sq", [(False, 1), (True, 3)])
def test_per_sequence_lengths_and_their_graph_replay(hopper, causal: bool, sq: int, template: str) -> None:
    """seq_lens: each batch row attends to its own first L keys of one dense cache (L = 0 gives zeros),
    read on the GPU, so a captured graph replays with new lengths; wrong seq_lens are a clear error."""
    import torch

    from tuner.kernels.feasibility import covering_sample
    from tuner.runtime.build import build_many
    from tuner.runtime.shipped.launcher import AttentionInputError
    from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

    problem = Problem(4, 8, sq, 1000, 128, dtype="bf16", causal=causal, heads_kv=2)
    q, clean_k, clean_v = make_inputs(problem, seed=3)
    k, v = _poisoned_past(clean_k, [1000, 17, 1, 0]), _poisoned_past(clean_v, [1000, 17, 1, 0])

    def expected(lens: list[int]) -> torch.Tensor:
        out = torch.zeros_like(q, dtype=torch.float32)
        for b, n in enumerate(lens):
            if n:
                out[b:b + 1] = reference(q[b:b + 1], clean_k[b:b + 1, :, :n], clean_v[b:b + 1, :, :n], causal)[0]
        return out

    for built in build_many(covering_sample(template, problem, hopper, seed=5)[:3], hopper.nvcc_arch):
        assert built.ok, built.compiled.log[-2000:]
        kernel = built.load()
        lens = torch.tensor([1000, 17, 1, 0], dtype=torch.int32, device="cuda")
        out = empty_output(q)
        kernel(q, k, v, out, seq_lens=lens)
        torch.cuda.synchronize()
        err = relative_error(out, expected([1000, 17, 1, 0]))
        assert err < TOLERANCE["bf16"], f"{built.variant.name}: rel error {err:.2e}"
        assert torch.count_nonzero(out[3]) == 0  # no key: zeros
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel.launch_unchecked(q, k, v, out, seq_lens=lens)
        lens.copy_(torch.tensor([5, 999, 64, 1000], dtype=torch.int32))
        k.copy_(_poisoned_past(clean_k, [5, 999, 64, 1000])), v.copy_(_poisoned_past(clean_v, [5, 999, 64, 1000]))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, expected([5, 999, 64, 1000])) < TOLERANCE["bf16"], built.variant.name
        with pytest.raises(AttentionInputError, match="seq_lens must be a contiguous int32"):
            kernel(q, k, v, out, seq_lens=lens.long())
        lens.copy_(torch.tensor([1000, 17, 1, 0], dtype=torch.int32))  # the next variant starts from the first
        k.copy_(_poisoned_past(clean_k, [1000, 17, 1, 0])), v.copy_(_poisoned_past(clean_v, [1000, 17, 1, 0]))


def _poisoned_past(x, lens: list[int]):
    """A copy of K or V [B, Hkv, Sk, D] with NaN in every row past its batch row's length: a cache's unused
    rows may hold anything, and must not reach the output (0 * NaN in P V would)."""
    out = x.clone()
    for b, n in enumerate(lens):
        out[b, :, n:] = float("nan")
    return out


def _paged_copy(k, page: int, lens: list[int], seed: int, nan: float = float("nan")):
    """k [B, Hkv, Sk, D] scattered into shuffled pages of a [pages, page, Hkv, D] cache (vLLM's layout),
    plus a spare page; every row no sequence holds (a last page's tail, unused pages) is `nan` (an FP8
    cache's bytes: 0x7f, e4m3's NaN); the block table [B, ceil(Sk / page)] (unused entries -1)."""
    import torch

    b, hkv, sk, d = k.shape
    per_seq = (sk + page - 1) // page
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(b * per_seq + 1, generator=gen)
    cache = torch.full((b * per_seq + 1, page, hkv, d), nan, dtype=k.dtype, device=k.device)
    table = torch.full((b, per_seq), -1, dtype=torch.int32)
    for bi in range(b):
        for pi in range((lens[bi] + page - 1) // page):
            pid = int(order[bi * per_seq + pi])
            table[bi, pi] = pid
            rows = k[bi, :, pi * page:min((pi + 1) * page, lens[bi])].transpose(0, 1)  # [rows, Hkv, D]
            cache[pid, :rows.shape[0]] = rows
    return cache, table.to(k.device)


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("sq, group, causal", [(1, 4, False), (4, 8, True), (2, 1, True)])
def test_paged_cache_with_shuffled_pages_and_ragged_lengths(hopper, page: int, sq: int, group: int,
                                                            causal: bool, template: str) -> None:
    """A paged K/V cache (block table in shuffled order, unused entries -1, a garbage page) gives what the
    dense rows give, for tiles smaller and larger than a page; a graph replays with a new table and lengths."""
    import torch

    from tuner.kernels.feasibility import covering_sample
    from tuner.runtime.build import build_many
    from tuner.runtime.shipped.launcher import AttentionInputError
    from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

    hkv = 2
    problem = Problem(3, hkv * group, sq, 700, 128, dtype="bf16", causal=causal, heads_kv=hkv)
    q, k, v = make_inputs(problem, seed=8)
    lens = [700, 1, 333]

    def expected(lens: list[int]) -> torch.Tensor:
        out = torch.zeros_like(q, dtype=torch.float32)
        for b, n in enumerate(lens):
            out[b:b + 1] = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal)[0]
        return out

    kc, table = _paged_copy(k, page, lens, seed=page)
    vc, table_v = _paged_copy(v, page, lens, seed=page)
    assert torch.equal(table, table_v)  # one table for K and V (same seed)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    for built in build_many(covering_sample(template, problem, hopper, seed=page)[:3], hopper.nvcc_arch):
        assert built.ok, built.compiled.log[-2000:]
        kernel = built.load()
        out = empty_output(q)
        kernel.paged(q, kc, vc, out, table, seq_lens)
        torch.cuda.synchronize()
        err = relative_error(out, expected(lens))
        assert err < TOLERANCE["bf16"], f"{built.variant.name} page {page}: rel error {err:.2e}"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel.paged(q, kc, vc, out, table, seq_lens, check=False)
        new = [64, 700, 5]
        kc2, table2 = _paged_copy(k, page, new, seed=page + 1)
        vc2, _ = _paged_copy(v, page, new, seed=page + 1)
        kc.copy_(kc2), vc.copy_(vc2), table.copy_(table2), seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, expected(new)) < TOLERANCE["bf16"], built.variant.name
        kc, table = _paged_copy(k, page, lens, seed=page)  # the next variant starts from the first table
        vc, _ = _paged_copy(v, page, lens, seed=page)
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        with pytest.raises(AttentionInputError, match="page_size must be 16, 32, 64, 128 or 256"):
            kernel.paged(q, kc[:, :8], vc[:, :8], out, table, seq_lens)


@pytest.mark.parametrize("page", [16, 128])
def test_an_fp8_cache_in_pages_with_ragged_lengths(hopper, page: int) -> None:
    """e4m3 k and v with their scales, dense with seq_lens and in shuffled pages whose unused rows hold e4m3
    NaNs: the reference of the real values over each row's keys; a 16-bit k is refused by name."""
    import torch

    from tuner.kernels.feasibility import covering_sample
    from tuner.runtime.build import build_many
    from tuner.runtime.fp8 import dequantized
    from tuner.runtime.shipped.launcher import AttentionInputError
    from tuner.runtime.verify import TOLERANCE, empty_output, fp8_inputs, reference, relative_error

    problem = Problem(3, 8, 1, 700, 128, dtype="bf16_kv_e4m3", heads_kv=2)
    q, k, v, ds = fp8_inputs(problem, seed=4)
    kr, vr = dequantized(k, ds.k), dequantized(v, ds.v)
    lens = [700, 1, 333]
    want = torch.zeros_like(q, dtype=torch.float32)
    for b, n in enumerate(lens):
        want[b:b + 1] = reference(q[b:b + 1].float(), kr[b:b + 1, :, :n], vr[b:b + 1, :, :n], False)[0]
    kc, table = _paged_copy(k.view(torch.uint8), page, lens, seed=page, nan=0x7F)
    vc, _ = _paged_copy(v.view(torch.uint8), page, lens, seed=page, nan=0x7F)
    kc, vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    for built in build_many(covering_sample("attn_decode", problem, hopper, seed=page)[:3], hopper.nvcc_arch):
        assert built.ok, built.compiled.log[-2000:]
        kernel = built.load()
        for call in ("dense", "paged"):
            out = empty_output(q)
            if call == "dense":
                kernel(q, k, v, out, seq_lens=seq_lens, descales=(None, ds.k, ds.v))
            else:
                kernel.paged(q, kc, vc, out, table, seq_lens, descales=(None, ds.k, ds.v))
            torch.cuda.synchronize()
            err = relative_error(out, want)
            assert err < TOLERANCE[problem.dtype], f"{built.variant.name} {call}: rel error {err:.2e}"
        with pytest.raises(AttentionInputError, match="takes float16 or bfloat16 q with float8_e4m3fn k and v"):
            kernel(q, kr.bfloat16(), vr.bfloat16(), empty_output(q))
        with pytest.raises(AttentionInputError, match=r"descales=\(None, k_scale, v_scale\)"):
            kernel(q, k, v, empty_output(q))


def test_a_paged_problem_is_searched_through_the_paged_launch(hopper, tmp_path) -> None:
    """`tuner search --layout paged16`: the decode template is chosen, every trial is verified and timed on
    K/V read from shuffled 16-row pages, and the store keeps the layout."""
    import sqlite3

    from tests.cli_helpers import run_tuner

    url = f"sqlite:///{tmp_path / 'paged.db'}"
    res = run_tuner("--db", url, "search", "--gpu", hopper.name, "--shape", "4,8,1,1000,128", "--hkv", "2",
                    "--dtype", "bf16", "--layout", "paged16", "--trials", "6", "--seed", "0")
    assert res.exit_code == 0, res.stderr[-3000:]
    with sqlite3.connect(tmp_path / "paged.db") as db:
        rows = db.execute("SELECT p.layout, t.status, v.template FROM trials t JOIN problems p ON t.problem_id = p.id "
                          "JOIN variants v ON t.variant_id = v.id").fetchall()
    assert rows and all(layout == "paged16" and template == "attn_decode" for layout, _, template in rows)
    assert sum(status == "ok" for _, status, _ in rows) >= 1, rows
    assert "paged16" in res.stdout


@pytest.mark.parametrize("layout, template", [("bhsd", None), ("paged32", None), ("paged32", "attn_decode_sm80")])
def test_a_ragged_batch_is_searched_with_its_lengths(hopper, tmp_path, layout: str, template) -> None:
    """`tuner search --lengths uniform:LO`: every trial is verified against the reference over each row's
    own keys (a kernel that ignored the lengths would be incorrect) and timed on that batch, SDPA gets
    the same batch as a mask, and the store keeps the distribution."""
    import sqlite3

    from tests.cli_helpers import run_tuner

    url = f"sqlite:///{tmp_path / 'ragged.db'}"
    res = run_tuner("--db", url, "search", "--gpu", hopper.name, "--shape", "6,16,1,3000,128", "--hkv", "4",
                    "--dtype", "bf16", "--layout", layout, "--lengths", "uniform:64", "--trials", "5", "--seed", "0",
                    *(["--template", template] if template else []))
    assert res.exit_code == 0, res.stderr[-3000:]
    with sqlite3.connect(tmp_path / "ragged.db") as db:
        rows = db.execute("SELECT p.lengths, t.status FROM trials t JOIN problems p ON t.problem_id = p.id").fetchall()
        baselines = {r[0] for r in db.execute("SELECT impl FROM baselines")}
    assert rows and all(lengths == "uniform:64" for lengths, _ in rows)
    statuses = [status for _, status in rows]  # "pruned": infeasible points the sampler proposed, never run
    assert statuses.count("ok") == 5 and set(statuses) <= {"ok", "pruned"}, rows
    assert baselines and "fa4" not in baselines and "sdpa_flash" not in baselines  # no mask, no ragged batch
    label = f"B6 H16 Hkv4 Sq1 Sk3000 D128 bf16{'' if layout == 'bhsd' else ' ' + layout} lengths"
    assert label in res.stdout + res.stderr  # the problem's label (on the progress line; the table cuts it)


def test_graphs_of_one_split_kernel_replay_side_by_side(hopper) -> None:
    """attn_decode_sm80 merges its key splits through a workspace and arrival counters: each graph captured
    from one kernel gets its own (counters zeroed inside the graph), so two graphs replayed at once on two
    streams, the second first, each give their own inputs' result. (On an H100 this replay did not expose
    the earlier shared-per-stream workspace: the race needs arrivals of the two launches to interleave.)"""
    import torch

    from tuner.kernels.feasibility import feasible_space
    from tuner.runtime.build import build_many
    from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

    # The serving decode step (one wave of CTAs, launched 4 times a graph): the replays run side by side, and
    # CTAs of one row block in both finish at about the same time (shared counters would mix their arrivals).
    problem = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8)
    pool = [v for v in feasible_space("attn_decode_sm80", problem, hopper) if v.params["SPLITS"] >= 4]
    built = build_many(pool[:1], hopper.nvcc_arch)[0]
    assert built.ok, built.compiled.log[-2000:]
    kernel = built.load()
    cases = [make_inputs(problem, seed=s) for s in (1, 2)]
    outs = [empty_output(q) for q, _, _ in cases]
    graphs = [torch.cuda.CUDAGraph() for _ in cases]
    for graph, (q, k, v), out in zip(graphs, cases, outs):
        with torch.cuda.graph(graph):  # both on torch's one default capture stream
            for _ in range(4):
                kernel.launch_unchecked(q, k, v, out)
    expected = [reference(q, k, v, False)[0] for q, k, v in cases]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(20):
        for out in outs:
            out.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, stream in zip(graphs[::-1], streams):  # the second graph first, each on its own stream
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for out, want in zip(outs, expected):
            assert relative_error(out, want) < TOLERANCE["bf16"], built.variant.name


@pytest.mark.parametrize("dtype", ["bf16_kv_e4m3", "fp16_kv_e4m3"])
def test_an_fp8_cache_kernel_scales_queries_of_any_magnitude(hopper, dtype: str) -> None:
    """Q enters the FP8 cache's fp16 products as q x 2^e with e from the block's largest |q|: a block whose
    largest row is far above fp16's range (bf16 q, e < 0), one far below it (e > 0), rows of very different sizes
    in one block, and an all-zero block all match the reference of the real values."""
    import torch

    from tuner.kernels.feasibility import covering_sample
    from tuner.runtime.build import build_many
    from tuner.runtime.fp8 import dequantized
    from tuner.runtime.verify import TOLERANCE, empty_output, fp8_inputs, reference, relative_error

    problem = Problem(4, 8, 2, 600, 128, dtype=dtype, heads_kv=2)
    q, k, v, ds = fp8_inputs(problem, seed=6)
    big = 3e5 if dtype == "bf16_kv_e4m3" else 6e4  # fp16 q cannot exceed 65504
    q[0] *= big / q[0].abs().amax()                   # batch row 0: its blocks' largest |q| near `big`
    q[1] *= 1e-6                                       # row 1: tiny
    q[2, 0] *= 1e3                                     # row 2: one head large, the others as drawn (~1)
    q[3] = 0                                           # row 3: all zero
    want = reference(q.float(), dequantized(k, ds.k), dequantized(v, ds.v), False)[0]
    for built in build_many(covering_sample("attn_decode", problem, hopper, seed=3)[:3], hopper.nvcc_arch):
        assert built.ok, built.compiled.log[-2000:]
        out = empty_output(q)
        built.load()(q, k, v, out, descales=(None, ds.k, ds.v))
        torch.cuda.synchronize()
        for b in range(4):
            err = relative_error(out[b], want[b])
            assert err < TOLERANCE[dtype], f"{built.variant.name} row {b}: rel error {err:.2e}"
