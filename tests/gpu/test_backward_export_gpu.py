"""The exported library trains on a GPU: attention() with inputs requiring grad runs the tuned forward kernel (O and
lse saved) and SDPA's cuDNN or flash backward on them. dQ, dK and dV against fp32 autograd of the reference (causal
and not, GQA, Sq != Sk, rows without keys, BSHD, fp16 / bf16, D64 / D128; each backward kind on its own too), the
forward's lse against the reference's, torch.compile of a training step against eager, a CUDA graph of forward and
backward, and register_transformers() serving a tiny Llama's training step.

    pytest -m gpu tests/gpu/test_backward_export_gpu.py -s
"""

from __future__ import annotations

import sys
import uuid

import pytest

from tuner.problem import Problem
from tuner.runtime.backward_verify import GRAD_TOLERANCE, reference_grads
from tuner.runtime.verify import TOLERANCE, make_inputs, reference, relative_error

pytestmark = pytest.mark.gpu

# The tuned problems of the package (one trial each; the kernels take any group and any lengths).
TUNED = [
    Problem(2, 8, 1024, 1024, 64, dtype="fp16"),
    Problem(2, 8, 1024, 1024, 64, dtype="fp16", causal=True, heads_kv=2),
    Problem(2, 16, 2048, 2048, 128, dtype="bf16", causal=True, heads_kv=4),
    Problem(2, 16, 2048, 2048, 128, dtype="bf16"),
]
CASES = [
    Problem(2, 8, 512, 512, 64, dtype="fp16"),                                      # MHA, non-causal
    Problem(1, 8, 300, 777, 64, dtype="fp16", causal=True, heads_kv=2),             # GQA, causal Sq < Sk
    Problem(2, 16, 1024, 1024, 128, dtype="bf16", causal=True, heads_kv=4),         # GQA 4, causal Sq == Sk
    Problem(1, 8, 200, 700, 128, dtype="bf16", heads_kv=8),                         # non-causal Sq != Sk
    Problem(1, 8, 500, 200, 128, dtype="bf16", causal=True, heads_kv=2),            # causal Sq > Sk: rows, no keys
    Problem(2, 8, 333, 333, 128, dtype="bf16", causal=True, heads_kv=2, layout="bshd"),  # BSHD views
    Problem(2, 8, 256, 256, 64, dtype="fp16", causal=True),                         # fp16 causal MHA
]


def _ids(p: Problem) -> str:
    return p.label.replace(" ", "_") + "_" + p.layout


@pytest.fixture(scope="module")
def package(gpu_profile, tmp_path_factory):
    """An export of a store holding one ok trial of each TUNED problem (the card's template, its first covering
    variant, built here; made-up timings), imported."""
    import importlib

    from tests.built_trials import add_built_trial
    from tuner.export.run import ExportOptions, export
    from tuner.kernels.feasibility import covering_sample, default_template
    from tuner.store import RunInfo, open_store

    base = tmp_path_factory.mktemp("backward_export_gpu")
    url = f"sqlite:///{base / 'results.db'}"
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="test", profile=gpu_profile.name, host="test"))
        for problem in TUNED:
            template = default_template(gpu_profile, [problem])
            variant = covering_sample(template, problem, gpu_profile)[0]
            add_built_trial(store, run, problem, variant, gpu_profile.nvcc_arch, 100.0, 2e-3)
        store.finish_run(run)
    name = f"bwd_{uuid.uuid4().hex[:8]}"
    export(ExportOptions(gpu=gpu_profile.name, out=base / name, db_url=url))
    sys.path.insert(0, str(base / name))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(base / name))


def _leaves(problem: Problem, seed: int):
    q, k, v = make_inputs(problem, seed=seed)
    return tuple(t.detach().requires_grad_(True) for t in (q, k, v))


def _check_grads(problem: Problem, grads, ref, what: str) -> None:
    tol = GRAD_TOLERANCE[problem.dtype]
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert g.shape == r.shape and g.dtype.is_floating_point
        assert not g.isnan().any(), f"{what} {name}: NaN"
        err = relative_error(g, r)
        assert err < tol, f"{what} {name}: rel error {err:.2e} (tolerance {tol:.0e})"


@pytest.mark.parametrize("problem", CASES, ids=_ids)
def test_gradients_match_fp32_autograd(package, problem: Problem) -> None:
    import torch

    q, k, v = _leaves(problem, seed=1)
    auto = package._runtime.autograd
    assert auto.serves(q, k, v, problem.causal), package.explain(q, k, v, causal=problem.causal)
    out = package.attention(q, k, v, causal=problem.causal)
    do = torch.randn_like(out)
    out.backward(do)
    torch.cuda.synchronize()
    ref_out, _ = reference(q.detach(), k.detach(), v.detach(), problem.causal)
    assert relative_error(out.detach(), ref_out) < TOLERANCE[problem.dtype]
    ref = reference_grads(q, k, v, do, problem.causal)
    text = str(package.explain(q, k, v, causal=problem.causal))
    _check_grads(problem, (q.grad, k.grad, v.grad), ref, f"{_ids(problem)} ({text.splitlines()[-1].strip()})")
    assert "backward: SDPA cuDNN backward" in text or "backward: SDPA flash backward" in text


@pytest.mark.parametrize("kind", ["flash", "cudnn"])
@pytest.mark.parametrize("problem", CASES, ids=_ids)
def test_each_backward_on_our_o_and_lse(package, problem: Problem, kind: str) -> None:
    """Each backward kind run directly on the tuned forward's O and lse (where it applies), and that lse against
    the reference's: natural log, -inf for rows without keys."""
    import torch

    bw, auto = package._runtime.backward, package._runtime.autograd
    cc = torch.cuda.get_device_capability()
    if kind == "cudnn" and (cc < (9, 0) or (problem.causal and problem.seq_q != problem.seq_k)):
        pytest.skip("cuDNN's backward serves sm_90+ calls whose causal mask is square")
    q, k, v = make_inputs(problem, seed=2)
    if kind == "cudnn" and isinstance(bw.cudnn_stats_form(q), str):
        pytest.skip(bw.cudnn_stats_form(q))
    kernel = auto.forward_kernel(q, k, v, problem.causal)
    assert not isinstance(kernel, str), kernel
    out, lse = auto._forward(kernel, q, k, v, None)
    do = torch.randn_like(out)
    grads = bw.run_backward(kind, do, q, k, v, out, lse, problem.causal, None)
    torch.cuda.synchronize()
    _, ref_lse = reference(q, k, v, problem.causal)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    _check_grads(problem, grads, reference_grads(q, k, v, do, problem.causal), f"{_ids(problem)} {kind}")


def test_inputs_without_grad_still_take_the_inference_path(package) -> None:
    import torch

    problem = CASES[2]
    q, k, v = make_inputs(problem, seed=3)
    out = package.attention(q, k, v, causal=True)
    assert out.grad_fn is None
    with torch.no_grad():
        assert package.attention(*_leaves(problem, 3), causal=True).grad_fn is None


def test_a_compiled_training_step_matches_eager(package) -> None:
    import torch

    problem = CASES[2]
    torch.manual_seed(0)
    proj = torch.nn.Linear(128, 128, device="cuda", dtype=torch.bfloat16)

    def step(q, k, v):
        out = package.attention(q, k, v, causal=True)
        return proj(out).float().square().mean()

    eager_inputs, compiled_inputs = _leaves(problem, 4), _leaves(problem, 4)
    step(*eager_inputs).backward()
    eager = [t.grad.clone() for t in eager_inputs] + [proj.weight.grad.clone()]
    proj.weight.grad = None
    compiled = torch.compile(step, fullgraph=True)
    compiled(*compiled_inputs).backward()
    got = [t.grad for t in compiled_inputs] + [proj.weight.grad]
    for name, g, e in zip(("dq", "dk", "dv", "dW"), got, eager):
        assert relative_error(g, e.float()) < 1e-2, name


def test_a_cuda_graph_captures_forward_and_backward(package) -> None:
    import torch

    problem = CASES[1]
    q, k, v = _leaves(problem, 5)
    do = torch.randn_like(q)

    def step():
        out = package.attention(q, k, v, causal=True)
        (out * do).sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: loads the kernel, finds cuDNN's stats layout, builds its graphs
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    fresh = _leaves(problem, 6)
    with torch.no_grad():
        for static, new in zip((q, k, v), fresh):
            static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager = package.attention(*fresh, causal=True)
    (eager * do).sum().backward()
    for name, g, e in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), (t.grad for t in fresh)):
        assert relative_error(g, e.float()) < 1e-3, name


def test_register_transformers_serves_a_tiny_llama_training_step(package, monkeypatch) -> None:
    """Each model gets its own config: from_config keeps the config object it is given (transformers 5.17 and
    5.24) and attn_implementation= sets that object's _attn_implementation, so one config shared by both models
    made the second (SDPA) switch the first to SDPA too: session 20's "0 of 2 layers" on the H200 (the tuned path
    was never asked), reproduced on a CPU in tests/test_hf_training_route.py."""
    import torch

    transformers = pytest.importorskip("transformers")
    name = package.register_transformers(f"tuned_bwd_{uuid.uuid4().hex[:6]}")

    def model(impl: str):
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                       max_position_embeddings=1024)
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).to("cuda", torch.float16)

    ours, sdpa = model(name), model("sdpa")
    sdpa.load_state_dict(ours.state_dict())
    cfg = ours.config
    assert (cfg._attn_implementation, sdpa.config._attn_implementation) == (name, "sdpa")
    calls = []
    auto = package._runtime.autograd
    real = auto.attention_with_grad
    monkeypatch.setattr(auto, "attention_with_grad", lambda *a: calls.append(1) or real(*a))
    ids = torch.randint(0, 512, (2, 256), device="cuda")
    losses = []
    for m in (ours, sdpa):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert len(calls) == cfg.num_hidden_layers, "the training step did not take the tuned path"
    assert abs(losses[0] - losses[1]) < 1e-2 * abs(losses[1])
    for (n, a), (_, b) in zip(ours.named_parameters(), sdpa.named_parameters()):
        if b.grad is not None and b.grad.abs().max() > 0:
            assert relative_error(a.grad.float(), b.grad.float()) < 3e-2, n

