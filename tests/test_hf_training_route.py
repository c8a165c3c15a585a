"""register_transformers() on a training step, without a GPU: a tiny Llama's attention calls (q [B, H, S, D] views of
transformers' [B, S, H, D] projections, K/V from its DynamicCache, requires_grad, no mask, dropout 0.0, a scaling,
module.training) reach autograd.attention_with_grad in every layer. Only what needs CUDA is faked: the tuned
forward kernel (fp32 math writing O and lse, as the kernels do) and the backward kernel run on that O and lse.

Also the cause of the GPU test's session-20 "0 of 2 layers": transformers' from_config keeps the config object it
is given and attn_implementation= sets it there, so a config shared with a second, SDPA model switches the first
one to SDPA as well (the tuned path is then never asked)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tuner.runtime.shipped import autograd as auto, backward as bw, hf

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")
NAME = "tuned_training_route_test"


class _FakeKernel:
    """The tuned forward's contract (autograd._forward): fits(), launch_unchecked() writing out and the natural-log
    lse [B, H, Sq]; causal bottom-right, GQA by head groups."""

    class shape:  # noqa: N801 - the loaded kernel's attribute
        fp8 = kv_fp8 = packed = False

    entry = "fake_kernel"

    def __init__(self, causal: bool) -> None:
        self.causal = causal

    def fits(self, q, k, v) -> bool:
        return True

    def launch_unchecked(self, q, k, v, out, lse, scale) -> None:
        group = q.shape[1] // k.shape[1]
        s = q.double() @ bw.expand_kv(k, group).double().transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
        sq, sk = s.shape[-2:]
        if self.causal:
            s = s.masked_fill(torch.arange(sk) > torch.arange(sq)[:, None] + (sk - sq), float("-inf"))
        lse.copy_(torch.logsumexp(s, -1))
        out.copy_(torch.softmax(s, -1) @ bw.expand_kv(v, group).double())


def _run_backward(kind, grad_out, q, k, v, out, lse, causal, scale):
    """dq, dk, dv from the saved O and lse (FlashAttention's backward, no forward recomputation), in float64."""
    group = q.shape[1] // k.shape[1]
    qd, ke, ve, do, o = (t.double() for t in (q, bw.expand_kv(k, group), bw.expand_kv(v, group), grad_out, out))
    scale = scale or q.shape[-1] ** -0.5
    s = qd @ ke.transpose(-1, -2) * scale
    sq, sk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(sk) > torch.arange(sq)[:, None] + (sk - sq), float("-inf"))
    p = torch.exp(s - lse.double()[..., None])
    ds = p * (do @ ve.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    dq, dk, dv = scale * ds @ ke, scale * ds.transpose(-1, -2) @ qd, p.transpose(-1, -2) @ do
    return dq.to(q.dtype), bw.group_sum(dk, group).to(k.dtype), bw.group_sum(dv, group).to(v.dtype)


@pytest.fixture
def fake_cuda_kernels(monkeypatch):
    """The tuned forward and the backward kernel faked; every call reaching attention_with_grad recorded."""
    monkeypatch.setattr(auto, "forward_kernel", lambda q, k, v, causal: _FakeKernel(causal))
    monkeypatch.setattr(bw, "device_backward", lambda q, causal, seq_k: bw.BackwardChoice(bw.FLASH, "faked"))
    monkeypatch.setattr(bw, "run_backward", _run_backward)
    calls = []
    real = auto.attention_with_grad
    monkeypatch.setattr(auto, "attention_with_grad", lambda *a: calls.append(a) or real(*a))
    return calls


def _llama(impl: str, config=None):
    import transformers

    config = config or transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=16, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)


def test_a_tiny_llama_training_step_reaches_attention_with_grad(fake_cuda_kernels) -> None:
    name = hf.register_transformers(NAME)
    ours, ref = _llama(name), _llama("sdpa")
    ref.load_state_dict(ours.state_dict())
    assert ours.training and ours.config._attn_implementation == name
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (ours, ref):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert len(fake_cuda_kernels) == ours.config.num_hidden_layers
    for q, k, v, causal, scale in fake_cuda_kernels:  # the call as transformers made it
        assert q.requires_grad and q.shape == (2, 4, 24, 16) and k.shape == v.shape == (2, 2, 24, 16)
        assert not q.is_contiguous()  # a [B, S, H, D] projection seen as [B, H, S, D]
        assert causal is True and scale == 16 ** -0.5
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_a_config_shared_with_an_sdpa_model_sends_both_to_sdpa(fake_cuda_kernels) -> None:
    """The GPU test's old mistake, kept visible: transformers sets attn_implementation on the config object itself."""
    name = hf.register_transformers(NAME)
    ours = _llama(name)
    _llama("sdpa", config=ours.config)
    assert ours.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    ours(input_ids=ids, labels=ids).loss.backward()
    assert fake_cuda_kernels == []
