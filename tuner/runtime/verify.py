"""Correctness: inputs, the fp32 reference and the error metric."""

from __future__ import annotations

import math
from typing import Any, Sequence

from tuner.problem import Problem

# Relative L2 error allowed against the fp32 reference (README, "How a trial runs").
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}


def torch_dtype(dtype: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def make_inputs(problem: Problem, device: str = "cuda", seed: int | None = None) -> tuple[Any, Any, Any]:
    """Fresh random q, k, v as logical [B, H, S, D] views in the problem's layout."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    dt = torch_dtype(problem.dtype)

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
    cache = torch.zeros(table.numel() + 1, page, hkv, d, device=t.device, dtype=t.dtype)
    padded = torch.nn.functional.pad(t, (0, 0, 0, per_seq * page - sk))  # [B, Hkv, per_seq * page, D]
    cache[table.reshape(-1).long()] = padded.transpose(1, 2).reshape(b * per_seq, page, hkv, d)
    return cache


def empty_output(q: Any) -> Any:
    """An output laid out like q (BSHD stays BSHD), poisoned with NaN so unwritten elements show."""
    import torch

    out = torch.empty_like(q)  # empty_like preserves q's strides for dense permuted tensors
    out.fill_(float("nan"))
    return out


def reference(q: Any, k: Any, v: Any, causal: bool, scale: float | None = None, chunk_rows: int = 1 << 26,
              key_lengths: Sequence[int] | None = None, window: tuple[int, int] = (-1, -1),
              softcap: float = 0.0) -> tuple[Any, Any]:
    """fp32 attention (output, log-sum-exp) with bottom-right causal alignment.

    Rows that see no key give 0 and lse = -inf, as the kernels do. With key_lengths, batch row b uses
    its first key_lengths[b] keys and causal aligns to that length (the decode kernels' seq_lens).
    `window` (left, right; -1 unbounded) keeps the keys j with i' - left <= j <= i' + right, i' the
    query's aligned position (Problem.window_left); `softcap` > 0 makes the logits softcap * tanh(logits /
    softcap), as FlashAttention and Gemma-2 do, after the scale. Computed in chunks of (batch, head) so
    that large problems fit in memory."""
    import torch

    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty(b, h, sq, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, h, sq, device=q.device, dtype=torch.float32)
    heads_per_chunk = max(1, chunk_rows // max(1, sq * sk))
    group = h // hkv
    for bi in range(b):
        used = sk if key_lengths is None else min(max(int(key_lengths[bi]), 0), sk)
        mask = ~keys_kept(sq, sk, used, causal, q.device, window)
        for h0 in range(0, h, heads_per_chunk):
            h1 = min(h, h0 + heads_per_chunk)
            qc = q[bi, h0:h1].float()
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


def keys_kept(sq: int, sk: int, used: int, causal: bool, device: Any, window: tuple[int, int] = (-1, -1)) -> Any:
    """[Sq, Sk] bool: key j is seen by query i (j < used, with causal j <= i + used - Sq, with a window
    i + used - Sq - left <= j <= i + used - Sq + right)."""
    import torch

    rows = torch.arange(sq, device=device)[:, None] + (used - sq)  # the queries' positions among the keys
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
                      key_lengths: Sequence[int] | None = None) -> tuple[Any, Any]:
    """reference() with every mask feature of the problem (causality, window, softcap)."""
    return reference(q, k, v, problem.causal, scale, key_lengths=key_lengths,
                     window=(problem.window_left, problem.window_right), softcap=problem.softcap)


def ragged_seq_lens(problem: Problem, device: Any) -> Any:
    """The int32 [B] key lengths a decode kernel takes for the problem's ragged batch (None: full lengths)."""
    import torch

    return torch.tensor(problem.key_lengths(), dtype=torch.int32, device=device) if problem.ragged else None


def ragged_mask(problem: Problem, device: Any) -> Any:
    """[B, 1, Sq, Sk] bool for SDPA's attn_mask: what each row of the problem's ragged batch sees."""
    import torch

    return torch.stack([keys_kept(problem.seq_q, problem.seq_k, n, problem.causal, device)
                        for n in problem.key_lengths()])[:, None]


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN anywhere gives inf."""
    import torch

    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.double()
    denom = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(o - r).item() / (denom if denom > 0 else 1.0)
