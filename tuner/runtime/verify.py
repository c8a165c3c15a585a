"""Correctness: inputs, the fp32 reference and the error metric."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from tuner.errors import TunerError
from tuner.dtypes import SPECS, spec
from tuner.problem import Problem
# The FP8 helpers live in tuner.runtime.fp8; Descales and dequantized are this module's API too.
from tuner.runtime.fp8 import Descales, dequantized, dequantized_inputs, quantize  # noqa: F401

# Relative L2 error allowed against the fp32 reference (README, "How a trial runs"), by dtype: the registry's
# tolerances (tuner.dtypes says why each is what it is).
TOLERANCE = {name: s.tolerance for name, s in SPECS.items()}
# Past this many scores per (batch, head) (Sq x Sk; 32768^2), the fp32 reference covers sampled query rows
# only: at 131072^2 one head's scores alone are 64 GiB.
FULL_REFERENCE_SCORES = 1 << 30
SAMPLED_BLOCK = 256  # query rows in each sampled block: the first, two in the middle, the last


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a problem's q (e4m3: torch.float8_e4m3fn, its output bf16; an FP8 KV cache's: its
    query dtype, k and v being float8_e4m3fn)."""
    import torch

    return getattr(torch, spec(dtype).query.torch)


def make_inputs(problem: Problem, device: str = "cuda", seed: int | None = None) -> tuple[Any, Any, Any]:
    """Fresh random q, k, v as logical [B, H, S, D] views in the problem's layout. With FP8 inputs they are
    fp8_inputs' tensors without their scales: where a kernel or the reference runs, use fp8_inputs."""
    if problem.fp8:
        return fp8_inputs(problem, device, seed)[:3]
    return _draw(problem, device, _generator(device, seed), torch_dtype(problem.dtype))


def fp8_inputs(problem: Problem, device: str = "cuda", seed: int | None = None) -> tuple[Any, Any, Any, Descales]:
    """Fresh random FP8 inputs (layout as make_inputs) and their float32 Descales [B, Hkv]: normal data, each
    (batch row, K/V head) scaled by 2^u (u uniform in [-1, 1]) so that the descales differ (a kernel reading
    the wrong one fails verification), quantised with descale = amax / 448 per (batch row, K/V head), over
    the group's q heads for q (tuner.runtime.fp8.quantize). e4m3: q, k and v; an FP8 KV cache: k and v, q in
    its query dtype and Descales.q None."""
    import torch

    if not problem.fp8:
        raise TunerError(f"fp8_inputs makes FP8 inputs, not {problem.dtype} ones (use make_inputs)")
    gen = _generator(device, seed)
    group = problem.heads // problem.heads_kv
    tensors = []
    for i, (t, heads_per_kv) in enumerate(zip(_draw(problem, device, gen, torch.float32), (group, 1, 1))):
        magnitude = 2.0 ** (torch.rand(problem.batch, problem.heads_kv, device=device, generator=gen) * 2 - 1)
        t.mul_(magnitude.repeat_interleave(heads_per_kv, dim=1)[:, :, None, None])
        tensors.append((t.to(torch_dtype(problem.dtype)), None) if i == 0 and problem.fp8_kv
                       else quantize(t, heads_per_kv))
    (q, dq), (k, dk), (v, dv) = tensors
    return q, k, v, Descales(dq, dk, dv)


def _generator(device: str, seed: int | None) -> Any:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    return gen


def _draw(problem: Problem, device: str, gen: Any, dt: Any) -> tuple[Any, Any, Any]:
    """Normal q, k, v in dtype `dt` drawn from `gen`, as [B, H, S, D] views of the problem's layout."""
    import torch

    def tensor(heads: int, seq: int) -> Any:
        if problem.layout == "bshd":
            t = torch.randn(problem.batch, seq, heads, problem.head_dim, device=device, dtype=dt, generator=gen)
            return t.transpose(1, 2)
        return torch.randn(problem.batch, heads, seq, problem.head_dim, device=device, dtype=dt, generator=gen)

    return tensor(problem.heads, problem.seq_q), tensor(problem.heads_kv, problem.seq_k), tensor(problem.heads_kv, problem.seq_k)


def paged_inputs(problem: Problem, k: Any, v: Any, seed: int = 0) -> dict[str, Any]:
    """k and v [B, Hkv, Sk, D] copied into paged caches of the problem's page size (vLLM's layout
    [pages, page, Hkv, D]), each sequence's pages in shuffled order, one spare page; the block table
    [B, ceil(Sk / page)] and the lengths (Sk each): what `AttentionKernel.paged` takes."""
    import torch

    page = problem.page_size
    b, hkv, sk, d = k.shape
    per_seq = -(-sk // page)
    table = torch.randperm(b * per_seq, generator=torch.Generator().manual_seed(seed)).view(b, per_seq)
    table = table.to(device=k.device, dtype=torch.int32)
    return {"k_cache": paged_cache(k, page, table), "v_cache": paged_cache(v, page, table), "block_table": table,
            "seq_lens": torch.full((b,), sk, dtype=torch.int32, device=k.device)}


def paged_cache(t: Any, page: int, table: Any) -> Any:
    """t [B, Hkv, Sk, D] as a [pages, page, Hkv, D] cache: row b's n-th page at table[b, n] (the tail of the
    last page zero), plus one spare page."""
    import torch

    b, hkv, sk, d = t.shape
    per_seq = table.shape[1]
    raw = t.view(torch.uint8) if t.element_size() == 1 else t  # fp8 moves as bytes (torch pads no fp8)
    cache = torch.zeros(table.numel() + 1, page, hkv, d, device=t.device, dtype=raw.dtype)
    padded = torch.nn.functional.pad(raw, (0, 0, 0, per_seq * page - sk))  # [B, Hkv, per_seq * page, D]
    cache[table.reshape(-1).long()] = padded.transpose(1, 2).reshape(b * per_seq, page, hkv, d)
    return cache.view(t.dtype)


def empty_output(q: Any) -> Any:
    """An output laid out like q (BSHD stays BSHD), poisoned with NaN so unwritten elements show; in q's
    dtype, bf16 for an fp8 q (an e4m3 problem's output)."""
    import torch

    fp8 = q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    # empty_like preserves q's strides for dense permuted tensors
    out = torch.empty_like(q, dtype=torch.bfloat16) if fp8 else torch.empty_like(q)
    out.fill_(float("nan"))
    return out


def reference(q: Any, k: Any, v: Any, causal: bool, scale: float | None = None, chunk_rows: int = 1 << 26,
              key_lengths: Sequence[int] | None = None, window: tuple[int, int] = (-1, -1),
              softcap: float = 0.0, rows: Sequence[int] | None = None) -> tuple[Any, Any]:
    """fp32 attention (output, log-sum-exp) with bottom-right causal alignment.

    Rows that see no key give 0 and lse = -inf, as the kernels do. With key_lengths, batch row b uses
    its first key_lengths[b] keys and causal aligns to that length (the decode kernels' seq_lens).
    `window` (left, right; -1 unbounded) keeps the keys j with i' - left <= j <= i' + right, i' the
    query's aligned position (Problem.window_left); `softcap` > 0 makes the logits softcap * tanh(logits /
    softcap), as FlashAttention and Gemma-2 do, after the scale. `rows`: only those query rows (out and
    lse [B, H, len(rows), ...]). Computed in chunks of (batch, head) so that large problems fit in memory."""
    import torch

    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    picked = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=q.device)
    n_rows = sq if picked is None else len(picked)
    out = torch.empty(b, h, n_rows, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, h, n_rows, device=q.device, dtype=torch.float32)
    heads_per_chunk = max(1, chunk_rows // max(1, n_rows * sk))
    group = h // hkv
    for bi in range(b):
        used = sk if key_lengths is None else min(max(int(key_lengths[bi]), 0), sk)
        mask = ~keys_kept(sq, sk, used, causal, q.device, window, picked)
        for h0 in range(0, h, heads_per_chunk):
            h1 = min(h, h0 + heads_per_chunk)
            qc = (q[bi, h0:h1] if picked is None else q[bi, h0:h1].index_select(1, picked)).float()
            kv_idx = torch.arange(h0, h1, device=q.device) // group
            kc, vc = k[bi, kv_idx].float(), v[bi, kv_idx].float()
            s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
            if softcap > 0:
                s = torch.tanh(s / softcap) * softcap
            s = s.masked_fill(mask, float("-inf"))
            m = s.amax(dim=-1, keepdim=True)
            m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m_safe)
            l = p.sum(dim=-1, keepdim=True)
            o = torch.matmul(p, vc) / torch.where(l > 0, l, torch.ones_like(l))
            out[bi, h0:h1] = o
            lse[bi, h0:h1] = torch.where(l[..., 0] > 0, m_safe[..., 0] + torch.log(l[..., 0]), torch.full_like(l[..., 0], float("-inf")))
    return out, lse


def keys_kept(sq: int, sk: int, used: int, causal: bool, device: Any, window: tuple[int, int] = (-1, -1),
              picked: Any = None) -> Any:
    """[Sq, Sk] bool (broadcastable: [1, Sk] where only `used` bounds it): key j is seen by query i (j < used,
    with causal j <= i + used - Sq, with a window i + used - Sq - left <= j <= i + used - Sq + right);
    `picked` (a tensor of query rows): those rows only."""
    import torch

    queries = torch.arange(sq, device=device) if picked is None else picked
    rows = queries[:, None] + (used - sq)  # the queries' positions among the keys
    cols = torch.arange(sk, device=device)[None, :]
    kept = cols < used
    if causal:
        kept = kept & (cols <= rows)
    left, right = window
    if left >= 0:
        kept = kept & (cols >= rows - left)
    if right >= 0:
        kept = kept & (cols <= rows + right)
    return kept


def problem_reference(problem: Problem, q: Any, k: Any, v: Any, scale: float | None = None,
                      key_lengths: Sequence[int] | None = None, rows: Sequence[int] | None = None) -> tuple[Any, Any]:
    """reference() with every mask feature of the problem (causality, window, softcap)."""
    return reference(q, k, v, problem.causal, scale, key_lengths=key_lengths,
                     window=(problem.window_left, problem.window_right), softcap=problem.softcap, rows=rows)


def sampled_rows(seq_q: int) -> Optional[list[int]]:
    """Four blocks of SAMPLED_BLOCK query rows: the first, two in the middle (positions past 2^16 at 128K)
    and the last, where causal rows see the most keys; None (every row) when there are not more rows."""
    if seq_q <= 4 * SAMPLED_BLOCK:
        return None
    starts = (0, seq_q // 2 - SAMPLED_BLOCK, seq_q // 2 + seq_q // 4, seq_q - SAMPLED_BLOCK)
    return sorted({r for s in starts for r in range(s, s + SAMPLED_BLOCK)})


@dataclass(frozen=True)
class Expected:
    """The fp32 reference output of a problem's inputs, for all query rows or sampled ones (`rows`)."""

    out: Any  # [B, H, Sq or len(rows), D] fp32
    rows: Optional[Sequence[int]] = None
    valid: Any = None  # bool [B, 1, Sq, 1]: the packed sequences' rows checked (packed_expected)

    def error(self, out: Any) -> float:
        """relative_error of a kernel's full output against this reference, on the rows it covers."""
        if self.valid is not None:
            import torch

            return relative_error(torch.where(self.valid, out, torch.zeros_like(out)), self.out)
        if self.rows is None:
            return relative_error(out, self.out)
        import torch

        picked = torch.as_tensor(list(self.rows), dtype=torch.long, device=out.device)
        return relative_error(out.index_select(2, picked), self.out)


def expected_output(problem: Problem, q: Any, k: Any, v: Any, scale: float | None = None,
                    key_lengths: Sequence[int] | None = None, descales: Descales | None = None) -> Expected:
    """The problem's reference, on sampled rows where every row would not fit (sampled_rows, by Sq x Sk).
    A problem with FP8 inputs needs their `descales`: its reference runs on the dequantised values."""
    if problem.fp8:
        if descales is None:
            raise TunerError(f"the reference of a problem in {problem.dtype} needs the scales of its FP8 inputs "
                             f"(fp8_inputs)")
        q, k, v = dequantized_inputs(q, k, v, descales)
    if problem.packed:
        return packed_expected(problem, q, k, v, scale)
    rows = None if problem.seq_q * problem.seq_k <= FULL_REFERENCE_SCORES else sampled_rows(problem.seq_q)
    return Expected(problem_reference(problem, q, k, v, scale, key_lengths, rows)[0], rows)


def ragged_seq_lens(problem: Problem, device: Any) -> Any:
    """The int32 [B] key lengths a decode kernel takes for the problem's ragged batch (None: full lengths)."""
    import torch

    return torch.tensor(problem.key_lengths(), dtype=torch.int32, device=device) if problem.ragged else None


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN anywhere gives inf."""
    import torch

    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.double()
    denom = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(o - r).item() / (denom if denom > 0 else 1.0)


def packed_expected(problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float]) -> Expected:
    """fp32 [B, H, S, D]: each sequence attending to its own keys (causal and the window aligned to its end), on
    all its rows, or on sampled ones (sampled_rows) where its n x n scores would not fit, as a dense problem's;
    `valid` marks the rows computed (the padded form's others hold no query, or were not sampled)."""
    import torch

    ref = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    valid = torch.zeros(q.shape[0], 1, q.shape[2], 1, dtype=torch.bool, device=q.device)
    for b, n in enumerate(problem.key_lengths()):
        rows = None if n * n <= FULL_REFERENCE_SCORES else sampled_rows(n)
        out = problem_reference(problem, q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n], scale,
                                rows=rows)[0]
        at = slice(0, n) if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=q.device)
        ref[b, :, at] = out[0]
        valid[b, 0, at] = True
    return Expected(ref, valid=valid)
