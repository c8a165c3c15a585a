"""The exported library's training path without a GPU: which backward serves which call and why (backward.py's
choose_backward, explain()'s line), that window / softcap / mask / FP8 / seq_lens calls keep SDPA for the whole
call, and the math the backward relies on, against plain torch in float64: our lse's convention, the conversions
to what SDPA's backwards read (flash's +inf rows, cuDNN's stats layout), and the GQA expansion and group sum."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from tuner.runtime.shipped import backward as bw

H200 = (9, 0)
A100 = (8, 0)


def _choose(**kw):
    args = dict(head_dim=128, causal=False, seq_q=2048, seq_k=2048, cc=H200)
    args.update(kw)
    return bw.choose_backward(**args)


# --- which backward serves which call ------------------------------------------------------------------------


def test_cudnn_serves_hopper_where_its_mask_and_head_dim_fit() -> None:
    assert _choose().kind == bw.CUDNN
    assert _choose(causal=True).kind == bw.CUDNN                      # Sq == Sk: top-left is bottom-right
    assert _choose(head_dim=64).kind == bw.CUDNN
    assert "cuDNN backward on the tuned forward's O and lse" in _choose().text()


@pytest.mark.parametrize("kw,why", [
    (dict(cc=A100), "sm_90+ only"),
    (dict(causal=True, seq_q=300, seq_k=777), "top-left"),
    (dict(head_dim=256), "head dim 256 > 128"),
    (dict(deterministic=True), "deterministic"),
    (dict(cudnn="cuDNN's SDPA does not run here (x)"), "does not run here"),
])
def test_flash_serves_where_cudnn_does_not_and_says_why(kw, why) -> None:
    choice = _choose(**kw)
    assert choice.kind == bw.FLASH and why in choice.reason
    assert choice.text().startswith("backward: SDPA flash backward (FlashAttention-2) on the tuned forward's O and lse")


def test_non_causal_sq_ne_sk_still_takes_cudnn() -> None:
    assert _choose(seq_q=300, seq_k=777).kind == bw.CUDNN


@pytest.mark.parametrize("kw,why", [
    (dict(mask=(255, -1, 0.0)), "sliding windows and softcaps"),
    (dict(mask=(-1, -1, 30.0)), "sliding windows and softcaps"),
    (dict(form="fp8"), "FP8 (e4m3) calls"),
    (dict(form="fp8_cache"), "FP8 KV-cache calls"),
    (dict(form="seq_lens"), "calls with seq_lens"),
    (dict(form="paged"), "paged calls"),
    (dict(forward="the call's cell is routed to SDPA"), "routed to SDPA"),
    (dict(cc=(7, 5)), "compute capability 8.0+"),
    (dict(head_dim=80 + 4), "multiples of 8"),
])
def test_what_keeps_sdpa_for_the_whole_call(kw, why) -> None:
    choice = _choose(**kw)
    assert choice.kind == bw.SDPA and why in choice.reason
    assert choice.text().startswith("backward: SDPA (the whole call, forward and backward), because ")


def test_without_a_device_the_rule_is_named() -> None:
    choice = _choose(cc=None)
    assert choice.kind == bw.FLASH and "no CUDA device here" in choice.reason and "sm_90+" in choice.reason


# --- the math, in float64 on the CPU --------------------------------------------------------------------------


def _inputs(b=2, h=4, hkv=2, sq=5, sk=7, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, sk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


def _attention(q, k, v, causal, scale):
    """softmax(scale q k^T) v with bottom-right causality, one K/V head per query head, and its natural-log lse
    (-inf for a row without keys, whose output is 0): the kernels' definition."""
    sq, sk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        kept = torch.arange(sk).view(1, sk) <= torch.arange(sq).view(sq, 1) + (sk - sq)
        s = s.masked_fill(~kept, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return p @ v, lse


def _backward_from_lse(do, q, k, v, o, lse, causal, scale):
    """FlashAttention's backward from O and lse alone (no forward recomputation of the softmax's normaliser):
    P = exp(scale s - lse), D = rowsum(dO * O), dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO."""
    sq, sk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        kept = torch.arange(sk).view(1, sk) <= torch.arange(sq).view(sq, 1) + (sk - sq)
        s = s.masked_fill(~kept, float("-inf"))
    p = torch.exp(s - lse[..., None])
    delta = (do * o).sum(-1, keepdim=True)
    ds = p * (do @ v.transpose(-1, -2) - delta)
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do


def test_our_lse_is_the_natural_log_of_the_scaled_scores_sum() -> None:
    q, k, v = _inputs(hkv=4)
    scale = 1 / math.sqrt(q.shape[-1])
    _, lse = _attention(q, k, v, False, scale)
    direct = torch.log(torch.exp(q @ k.transpose(-1, -2) * scale).sum(-1))
    torch.testing.assert_close(lse, direct)
    assert not torch.allclose(lse, direct / math.log(2))  # not log2


@pytest.mark.parametrize("causal,sq,sk", [(False, 5, 7), (True, 7, 7), (True, 5, 9), (True, 9, 5)])
def test_gqa_backward_from_the_converted_lse_matches_autograd(causal, sq, sk) -> None:
    """The path's math end to end: k, v expanded over the group, the backward fed O and the lse as flash reads it
    (+inf rows), dK and dV summed over the group, against float64 autograd of GQA attention."""
    q, k, v = _inputs(sq=sq, sk=sk)
    group, scale = q.shape[1] // k.shape[1], 0.3
    do = torch.randn_like(q)
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    o_ref, _ = _attention(q_, k_.repeat_interleave(group, 1), v_.repeat_interleave(group, 1), causal, scale)
    o_ref.backward(do)
    ke, ve = bw.expand_kv(k, group), bw.expand_kv(v, group)
    o, lse = _attention(q, ke, ve, causal, scale)
    lse = bw.flash_lse(lse, causal and sq > sk)
    dq, dke, dve = _backward_from_lse(do, q, ke, ve, o, lse, causal, scale)
    torch.testing.assert_close(dq, q_.grad)
    torch.testing.assert_close(bw.group_sum(dke, group), k_.grad)
    torch.testing.assert_close(bw.group_sum(dve, group), v_.grad)
    if causal and sq > sk:  # the first rows see no key: zero gradient, no NaN (-inf would give inf there)
        assert torch.isinf(lse).any() and (lse[torch.isinf(lse)] > 0).all()
        assert dq[:, :, : sq - sk].abs().max() == 0


def test_flash_lse_changes_only_rows_without_keys_and_only_when_asked() -> None:
    lse = torch.tensor([[[0.5, float("-inf"), 2.0]]])
    assert bw.flash_lse(lse, False) is lse
    assert bw.flash_lse(lse, True).tolist() == [[[0.5, float("inf"), 2.0]]]


def test_group_sum_is_the_gradient_of_expand_kv() -> None:
    k = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: bw.expand_kv(t, 4), (k,))
    grad = torch.randn(2, 12, 4, 5, dtype=torch.float64)
    (auto,) = torch.autograd.grad(bw.expand_kv(k, 4), k, grad)
    torch.testing.assert_close(bw.group_sum(grad, 4), auto)
    assert bw.expand_kv(k, 1) is k and bw.group_sum(grad, 1) is grad
    # head h reads K/V head h // group
    assert torch.equal(bw.expand_kv(k, 4)[:, 5], k[:, 1])


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_of_the_gqa_reference_path(causal) -> None:
    q, k, v = _inputs(b=1, h=4, hkv=2, sq=3, sk=4, d=4)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v))

    def f(q, k, v):
        return _attention(q, bw.expand_kv(k, 2), bw.expand_kv(v, 2), causal, 0.5)[0]

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (1, 0, 2)])
@pytest.mark.parametrize("rank", [3, 4])
def test_stats_layout_keeps_the_values_in_cudnns_layout(order, rank) -> None:
    lse = torch.randn(2, 3, 5, dtype=torch.float64)
    stats = bw.stats_layout(lse, rank, order)
    assert stats.dim() == rank and tuple(stats.shape[:3]) == (2, 3, 5)
    assert bw.stride_order(stats) == order
    torch.testing.assert_close(stats[..., 0] if rank == 4 else stats, lse)


def test_stride_order_reads_bshd_views() -> None:
    assert bw.stride_order(torch.empty(2, 3, 5, 8)) == (0, 1, 2)
    assert bw.stride_order(torch.empty(2, 5, 3, 8).transpose(1, 2)) == (0, 2, 1)


# --- the exported package: explain() and the calls no kernel serves ---------------------------------------------

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from tests.test_export import _unique, import_exported, write_export_store
    from tuner.export.run import ExportOptions, export

    base = tmp_path_factory.mktemp("backward_export")
    store = write_export_store(f"sqlite:///{base / 'results.db'}")
    name = _unique("bwd")
    export(ExportOptions(gpu="h100", out=base / name, db_url=store.url))
    return import_exported(base / name, name)


def _meta(h=8, hkv=8, sq=2048, sk=2048, d=64, dtype=torch.float16, grad=True):
    q = torch.empty(1, h, sq, d, dtype=dtype, device="meta", requires_grad=grad)
    k, v = (torch.empty(1, hkv, sk, d, dtype=dtype, device="meta", requires_grad=grad) for _ in range(2))
    return q, k, v


@needs_nvcc
def test_explain_names_the_backward_of_a_training_call(package) -> None:
    text = str(package.explain(*_meta()))
    assert "backward: SDPA flash backward (FlashAttention-2) on the tuned forward's O and lse" in text
    assert "no CUDA device here" in text
    assert "backward:" not in str(package.explain(*_meta(grad=False)))


@needs_nvcc
@pytest.mark.parametrize("kw,why", [
    (dict(window_size=(255, -1)), "sliding windows and softcaps"),
    (dict(softcap=30.0), "sliding windows and softcaps"),
    (dict(d=80), "the tuned forward cannot take the call"),
])
def test_explain_says_sdpa_runs_the_whole_call_and_why(package, kw, why) -> None:
    d = kw.pop("d", 64)
    text = str(package.explain(*_meta(d=d), **kw))
    assert "backward: SDPA (the whole call, forward and backward), because" in text and why in text


@needs_nvcc
def test_explain_of_a_paged_or_fp8_training_call_keeps_sdpa(package) -> None:
    q, k, v = _meta(sq=1, sk=256)
    lens = torch.empty(1, dtype=torch.int32, device="meta")
    assert "calls with seq_lens have no differentiable tuned path" in str(package.explain(q, k, v, seq_lens=lens))
    q8, k8, v8 = (t.detach().to(torch.float8_e4m3fn).requires_grad_(False) for t in _meta())
    q8 = q8.float().requires_grad_(True).to(torch.float8_e4m3fn)
    d = torch.empty(1, 8, device="meta")
    text = str(package.explain(q8, k8, v8, q_descale=d, k_descale=d, v_descale=d))
    assert "FP8 (e4m3) calls have no differentiable tuned path" in text


@needs_nvcc
@pytest.mark.parametrize("kw", [dict(), dict(window_size=(15, -1)), dict(softcap=20.0)])
def test_a_cpu_training_call_keeps_sdpa_and_its_gradients(package, kw) -> None:
    """On a CPU (no kernel) a training call runs the fallback for the whole call, differentiably, as before; no
    kernel serves it, so the differentiable tuned path says no."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 40, 64, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, 2, 40, 64, generator=gen, requires_grad=True) for _ in range(2))
    assert not package._runtime.autograd.serves(q, k, v, True)
    out = package.attention(q, k, v, causal=True, fallback="sdpa", **kw)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    with pytest.raises(package.AttentionInputError):
        package.attention(q, k, v, causal=True, **kw)


@needs_nvcc
def test_the_training_ops_are_registered_with_fake_implementations(package) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = getattr(torch.ops, package.MANIFEST["package"])
    q, k, v = (t.to(torch.bfloat16) for t in _inputs(h=8, hkv=2, sq=6, sk=9, d=16))
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = ops.attention_train(fq, fk, fv, True, None)
        assert out.shape == fq.shape and lse.shape == (2, 8, 6) and lse.dtype == torch.float32
        dq, dk, dv = ops.attention_train_backward(out, fq, fk, fv, out, lse, True, None)
        assert (dq.shape, dk.shape, dv.shape) == (fq.shape, fk.shape, fv.shape)
