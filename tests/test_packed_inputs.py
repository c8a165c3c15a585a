"""Packed sequences in a search, on the CPU: the packed copies a kernel reads, the per-sequence reference a
trial is checked against, and the error that ignores the padded form's rows past each sequence."""

from __future__ import annotations

import dataclasses
import math

import torch

from tuner.problem import Problem
from tuner.runtime.packed import packed_call, packed_inputs, unpack_into
from tuner.runtime.verify import expected_output, make_inputs, reference

PROBLEM = Problem(5, 4, 90, 90, 64, "fp16", causal=True, heads_kv=2, layout="packed", lengths="uniform:1",
                  window_left=20)


def _inputs():
    q, k, v = make_inputs(PROBLEM, "cpu", seed=1)
    return q.float(), k.float(), v.float()


def test_packed_copies_hold_each_sequence_once_in_order() -> None:
    q, k, v = _inputs()
    p = packed_inputs(PROBLEM, q, k, v)
    lengths = PROBLEM.key_lengths()
    assert p["lengths"] == lengths and p["max"] == max(lengths)
    assert p["cu"].dtype == torch.int32 and p["cu"].tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert p["q"].shape == (sum(lengths), 4, 64) and p["k"].shape == (sum(lengths), 2, 64) and p["q"].is_contiguous()
    back = torch.full_like(q, float("nan"))
    unpack_into(p["q"], back, lengths)
    for b, n in enumerate(lengths):
        assert torch.equal(back[b, :, :n], q[b, :, :n]) and torch.isnan(back[b, :, n:]).all()


def test_the_reference_is_each_sequence_alone_and_padding_is_not_judged() -> None:
    q, k, v = _inputs()
    scale = 1 / math.sqrt(64)
    expected = expected_output(PROBLEM, q, k, v, scale)
    for b, n in enumerate(PROBLEM.key_lengths()):
        alone = reference(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n], True, scale, window=(20, -1))[0]
        assert torch.allclose(expected.out[b:b + 1, :, :n], alone)
    out = expected.out.clone()
    n0 = PROBLEM.key_lengths()[0]
    out[0, :, n0:] = float("nan")  # rows past a sequence's end: never written by a packed kernel
    assert expected.error(out) == 0.0
    out[0, 0, 0, 0] = float("nan")  # a sequence's own row unwritten
    assert expected.error(out) == float("inf")


def test_the_verify_launch_scatters_and_the_timed_launch_does_not() -> None:
    q, k, v = _inputs()
    data = {"packed": packed_inputs(PROBLEM, q, k, v), "scale": 0.125}
    calls = []

    class FakePackedKernel:
        def packed(self, pq, pk, pv, out, cu_q, cu_k, max_q, max_k, scale, check):
            calls.append((max_q, max_k, scale, check, cu_q is cu_k))
            out.copy_(pq * 2)

    padded = torch.full_like(q, float("nan"))
    packed_call(FakePackedKernel(), data, padded, checked=True)()
    assert calls[-1] == (data["packed"]["max"], data["packed"]["max"], 0.125, True, True)
    assert torch.equal(padded[1, :, :3], 2 * q[1, :, :3])
    untouched = padded.clone()
    packed_call(FakePackedKernel(), data, padded, checked=False)()
    assert calls[-1][3] is False and torch.equal(padded.nan_to_num(), untouched.nan_to_num())


def test_a_packed_batch_is_timed_against_sdpa_per_sequence_and_fa4_varlen(monkeypatch) -> None:
    import sys

    from fa4_fakes import install_fake_fa4
    from tuner.runtime.baselines import available_baselines

    calls = []

    def fake_varlen(q, k, v, **kwargs):
        calls.append(kwargs)
        return q

    install_fake_fa4(monkeypatch, lambda *a, **k: None)
    monkeypatch.setattr(sys.modules["flash_attn.cute"], "flash_attn_varlen_func", fake_varlen, raising=False)
    q, k, v = _inputs()
    found = {b.name: b for b in available_baselines(PROBLEM, q, k, v, 0.125)}
    assert "fa4" in found and calls  # made and called once (its compile) before any timing
    lengths = PROBLEM.key_lengths()
    assert calls[0]["cu_seqlens_q"].tolist() == calls[0]["cu_seqlens_k"].tolist() == packed_inputs(
        PROBLEM, q, k, v)["cu"].tolist()
    assert (calls[0]["max_seqlen_q"], calls[0]["window_size"], calls[0]["causal"]) == (max(lengths), (20, None), True)
    # SDPA once per sequence, as the reference computes each (without the window: its flash backend runs on a CPU).
    plain = dataclasses.replace(PROBLEM, window_left=-1)
    sdpa = [b for b in available_baselines(plain, q, k, v, 0.125) if b.name == "sdpa_flash"]
    with sdpa[0].restrict():
        outs = sdpa[0].call()
    for b, (n, out) in enumerate(zip(plain.key_lengths(), outs)):
        alone = reference(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n], True, 0.125)[0]
        assert torch.allclose(out, alone, atol=1e-4)
