"""Windows and softcap end to end on a GPU: a real short search of a windowed and a softcapped problem, the
export, attention(window_size=, softcap=) against the fp32 reference, and a Mistral-shaped model (sliding
window 1024) registered with transformers running the windowed kernel, its logits those of SDPA.

    pytest -m gpu tests/gpu/test_windows_export_gpu.py -s
"""

from __future__ import annotations

import importlib
import math
import sys

import pytest

from tests.cli_helpers import run_tuner
from tuner.problem import Problem
from tuner.runtime.verify import TOLERANCE, make_inputs, problem_reference, relative_error

pytestmark = pytest.mark.gpu
WINDOWED = Problem(1, 16, 4096, 4096, 128, dtype="bf16", causal=True, heads_kv=4, window_left=1023)
CAPPED = Problem(1, 8, 2048, 2048, 256, dtype="bf16", causal=True, softcap=50.0)


@pytest.fixture(scope="module")
def package(gpu_profile, tmp_path_factory):
    base = tmp_path_factory.mktemp("windows_gpu")
    url = f"sqlite:///{base / 'results.db'}"
    for args in (["--shape", "1,16,4096,128", "--hkv", "4", "--window", "1023"],
                 ["--shape", "1,8,2048,256", "--softcap", "50"]):
        res = run_tuner("--db", url, "search", "--gpu", gpu_profile.name, *args, "--dtype", "bf16", "--causal",
                        "--trials", "3", "--seed", "0", "--confirm", "0")
        assert res.exit_code == 0, res.stderr[-3000:]
    res = run_tuner("--db", url, "export", "--gpu", gpu_profile.name, "--out", str(base / "win_pkg"))
    assert res.exit_code == 0, res.stderr[-3000:]
    sys.path.insert(0, str(base / "win_pkg"))  # the package (win_pkg) inside the --out folder
    try:
        return importlib.import_module("win_pkg")
    finally:
        sys.path.remove(str(base / "win_pkg"))


@pytest.mark.parametrize("problem", [WINDOWED, CAPPED, Problem(2, 16, 3000, 3000, 128, dtype="bf16", causal=True,
                                                                heads_kv=4, window_left=1023)],
                         ids=lambda p: p.label.replace(" ", "_"))
def test_attention_with_a_window_or_softcap_matches_the_reference(package, problem: Problem) -> None:
    import torch

    q, k, v = make_inputs(problem, seed=3)
    window = (problem.window_left, 0)
    with torch.no_grad():
        out = package.attention(q, k, v, causal=True, window_size=window, softcap=problem.softcap)
    torch.cuda.synchronize()
    err = relative_error(out, problem_reference(problem, q, k, v)[0])
    assert err < TOLERANCE[problem.dtype], err
    said = str(package.explain(q, k, v, causal=True, window_size=window, softcap=problem.softcap))
    print(f"\n{problem.label}: {said}")
    assert "attn_fwd_wgmma" in said, said  # a tuned kernel of that window / softcap, not a fallback


def test_a_mistral_shaped_model_runs_the_windowed_kernel_with_sdpa_s_logits(package) -> None:
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    cfg = transformers.MistralConfig(vocab_size=32000, hidden_size=2048, intermediate_size=4096,
                                     num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
                                     head_dim=128, sliding_window=1024, max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                              dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (1, 4096), device="cuda")
    with torch.no_grad():
        want = model(ids).logits.float()
        model.set_attn_implementation(package.register_transformers())
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = model(ids).logits.float()
    kernels = {e.key for e in prof.key_averages()}
    assert any(name.startswith("attn_fwd_wgmma") and "_wl1023" in name for name in kernels), sorted(kernels)[:20]
    err = relative_error(got, want)
    print(f"\nMistral-shaped, 2 layers, B1 S4096, sliding window 1024: logits rel error vs SDPA {err:.2e}")
    assert err < 2e-2 and math.isfinite(err)
