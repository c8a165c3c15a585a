"""transformers integration with sliding windows and logit softcapping (CPU: every call takes the fallbacks).

Semantics, from transformers' masking_utils (5.x): a sliding layer's key j is visible from query q iff
q - sliding_window < j <= q, i.e. window_size (sliding_window - 1, 0); Gemma-2's attention passes softcap=
attn_logit_softcapping. The runtime in place (tuner/runtime/shipped) is what every export ships."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tuner.runtime.shipped import hf
from tuner.runtime.shipped.masked import keys_kept
from tuner.runtime.verify import reference

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
NAME = "tuned_windows_test"


def test_the_sliding_window_mask_function_is_recognised_and_nothing_else() -> None:
    from transformers import masking_utils as mu

    assert hf.sliding_window_of(mu.sliding_window_causal_mask_function(4096)) == 4096
    others = [mu.causal_mask_function, mu.sliding_window_bidirectional_mask_function(8),
              mu.chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long)),
              mu.and_masks(mu.sliding_window_overlay(8), mu.causal_mask_function, mu.causal_mask_function),
              mu.or_masks(mu.sliding_window_causal_mask_function(8), mu.causal_mask_function),
              mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(8))]
    assert [hf.sliding_window_of(f) for f in others] == [None] * len(others)


@pytest.mark.parametrize("q_length, kv_length, q_offset, kv_offset", [
    (20, 20, 0, 0),    # prefill
    (1, 8, 30, 23),    # decode, a dynamic sliding-window cache (its window - 1 past keys, then the new one)
    (5, 12, 25, 18),   # a chunk of 5 queries on that cache
    (6, 6, 0, 0),      # shorter than the window
])
def test_a_plain_sliding_layers_mask_becomes_a_window_marker_of_the_same_meaning(q_length, kv_length, q_offset,
                                                                                  kv_offset) -> None:
    """window_size (W - 1, -1) over the keys, bottom-right, is the mask transformers' SDPA path builds."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    w = 8
    args = dict(batch_size=2, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                mask_function=sliding_window_causal_mask_function(w), attention_mask=None, local_size=w)
    marker = hf.transformers_mask(**args)
    assert marker.dtype == torch.int32 and marker.shape == (2, 1, 0, w) and marker.numel() == 0
    want = sdpa_mask(**{**args, "allow_is_causal_skip": False})
    assert torch.equal(keys_kept(q_length, kv_length, True, (w - 1, -1), "cpu").expand_as(want), want)


def test_other_sliding_masks_stay_transformers_sdpa_masks() -> None:
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    base = dict(batch_size=2, q_length=4, kv_length=12, q_offset=8, kv_offset=0,
                mask_function=sliding_window_causal_mask_function(6), attention_mask=None, local_size=6)
    padding = torch.ones(2, 12, dtype=torch.bool)
    padding[0, :2] = False
    for change in (dict(attention_mask=padding), dict(q_offset=torch.tensor(8)), dict(q_offset=3),
                   dict(allow_is_causal_skip=False), dict(local_size=7)):
        args = {**base, **change}
        got, want = hf.transformers_mask(**args), sdpa_mask(**args)
        assert got.dtype == torch.bool and torch.equal(got, want), change


class _Module(torch.nn.Module):
    """An attention layer as transformers' integrations see it (causal, a GQA group of 2)."""

    is_causal = True
    num_key_value_groups = 2


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("grad", [False, True])
def test_a_window_marker_runs_the_window_and_softcap(softcap, grad) -> None:
    """Through attention() (no kernel on a CPU: its fallbacks), or with gradients through the SDPA / softcap path
    under the equivalent mask: both the fp32 reference's window (W - 1, -1) and softcap."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 20, 16, generator=gen, requires_grad=grad)
    k, v = (torch.randn(2, 2, 20, 16, generator=gen) for _ in range(2))
    marker = hf.window_marker(2, 8, "cpu")
    out, _ = hf.transformers_attention(_Module(), q, k, v, marker, scaling=0.25, softcap=softcap, sliding_window=8)
    ref, _ = reference(q.detach(), k, v, True, scale=0.25, window=(7, -1), softcap=softcap or 0.0)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    if grad:
        out.sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()


def test_the_sliding_window_keyword_is_the_window_where_no_mask_came() -> None:
    """A layer called with no mask and sliding_window=W (as transformers' FlashAttention path reads it)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=gen) for _ in range(3))
    out, _ = hf.transformers_attention(_Module(), q, k, v, None, sliding_window=5)
    ref, _ = reference(q, k, v, True, window=(4, -1))
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_attention_sinks_are_refused() -> None:
    q = torch.randn(1, 2, 4, 16)
    for sinks in ({"s_aux": torch.zeros(2)}, {"sinks": torch.zeros(2)}):
        with pytest.raises(ValueError, match="attention sinks"):
            hf.transformers_attention(_Module(), q, q, q, None, **sinks)


def _tiny(config_class, model_class, **extra):
    config = config_class(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    return model_class(config).eval()


def _models():
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                              LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    return {"mistral": lambda: _tiny(MistralConfig, MistralForCausalLM, sliding_window=8),
            "gemma2": lambda: _tiny(Gemma2Config, Gemma2ForCausalLM, sliding_window=8, query_pre_attn_scalar=16),
            "gemma3": lambda: _tiny(Gemma3TextConfig, Gemma3ForCausalLM, sliding_window=8),
            "qwen2": lambda: _tiny(Qwen2Config, Qwen2ForCausalLM, use_sliding_window=True, sliding_window=8,
                                   max_window_layers=1),
            "llama": lambda: _tiny(LlamaConfig, LlamaForCausalLM)}


@pytest.mark.parametrize("model", ["mistral", "gemma2", "gemma3", "qwen2", "llama"])
def test_tiny_models_match_eager(model, monkeypatch) -> None:
    """Prefill (sliding layers longer than their window), a dynamic cache's decode step, a padded batch, and
    generate() on a static cache with no mask (its masks prepared ahead and handed back to the model): the
    logits and tokens of transformers' eager attention."""
    name = hf.register_transformers(NAME)
    m = _models()[model]()
    calls = []
    spy = hf.attention
    monkeypatch.setattr(hf, "attention", lambda *a, **kw: calls.append(kw) or spy(*a, **kw))
    ids = torch.randint(1, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    padding = torch.ones_like(ids)
    padding[0, :4] = 0
    results = {}
    for impl in ("eager", name):
        m.set_attn_implementation(impl)
        with torch.no_grad():
            prefix = m(ids[:, :20], use_cache=True)
            results[impl] = (m(ids).logits, m(ids[:, 20:21], past_key_values=prefix.past_key_values).logits,
                             m(ids, attention_mask=padding).logits[padding.bool()],
                             m.generate(ids[1:, :12], max_new_tokens=6, do_sample=False, cache_implementation="static"))
    for ours, eager in zip(results[name], results["eager"]):
        torch.testing.assert_close(ours, eager, atol=1e-5, rtol=1e-5)
    if model != "llama":  # the sliding layers' prefill reached attention() with their window (kernels take it)
        assert any(kw.get("window_size") == (7, -1) for kw in calls), calls
    if model == "gemma2":
        assert all(kw.get("softcap") == 50.0 for kw in calls)
