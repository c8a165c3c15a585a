"""benchmarks/train_e2e.py's pure parts, without a GPU: its arguments, the layers' problem, the rounds' summary, the
gradient comparison, the counter of what the differentiable path ran, the printed table, and gradient_check on a
tiny CPU Llama whose tuned kernels are faked (tests/test_hf_training_route.py's fakes): one model object switched
between the two implementations, the calls counted where the real runtime makes them."""

from __future__ import annotations

import types

import pytest
import torch

from benchmarks.train_e2e import (LLAMA_8B, compare_gradients, gradient_check, layer_problem, loss_row, markdown,
                                  parse_args, round_summary, training_step, tuned_calls)
from tests.test_hf_training_route import _llama, fake_cuda_kernels  # noqa: F401 - the fixture, used by name
from tuner.runtime.shipped import autograd, backward, hf, tuned_backward


def test_defaults_are_the_issues_step() -> None:
    args = parse_args([])
    assert (args.layers, args.batch, args.seq, args.vocab, args.package, args.no_control) == (4, 4, 4096, 32000,
                                                                                              None, False)
    assert parse_args(["--layers", "2", "--seq", "256", "--no-control"]).seq == 256


@pytest.mark.parametrize(("argv", "says"), [(["--layers", "0"], "--layers: '0' is not a positive integer"),
                                            (["--rounds", "-3"], "--rounds: '-3' is not a positive integer"),
                                            (["--seq", "4k"], "--seq: '4k' is not a positive integer"),
                                            (["--package", "out/pkg", "--variant", "v"], "not both")])
def test_bad_arguments_stop_with_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: " in last and last.endswith(says)


def test_the_layers_problem_is_the_models_attention_call() -> None:
    problem = layer_problem(LLAMA_8B, 4, 4096)
    assert (problem.batch, problem.heads, problem.heads_kv, problem.seq_q, problem.seq_k, problem.head_dim,
            problem.dtype, problem.causal) == (4, 32, 8, 4096, 4096, 128, "bf16", True)


def test_round_summary_is_the_median_of_per_round_ratios() -> None:
    times = {"ours": [100.0, 90.0, 110.0], "sdpa": [110.0, 108.0, 110.0]}  # ratios 1.1, 1.2, 1.0
    got = round_summary(times, tokens_per_step=16384)
    assert got["ratio"] == pytest.approx(1.1)
    assert (got["ratio_min"], got["ratio_max"]) == (pytest.approx(1.0), pytest.approx(1.2))
    assert got["ours_ms"] == 100.0 and got["sdpa_ms"] == 110.0 and got["rounds"] == 3
    assert got["ours_tok_s"] == pytest.approx(163840.0)
    # The ratio of medians would be 1.1 too here; per round it is not: a slow round on both sides cancels.
    skewed = round_summary({"ours": [100.0, 200.0, 100.0], "sdpa": [105.0, 230.0, 90.0]}, 1)
    assert skewed["ratio"] == pytest.approx(1.05)


@pytest.mark.parametrize("times", [{"ours": [1.0], "sdpa": [1.0, 2.0]}, {"ours": [], "sdpa": []},
                                   {"ours": [0.0], "sdpa": [1.0]}, {"sdpa": [1.0]}])
def test_round_summary_refuses_unpaired_or_empty_rounds(times: dict) -> None:
    with pytest.raises(ValueError, match="one positive time per round"):
        round_summary(times, 1)


def test_gradients_compared_per_parameter_the_worst_named() -> None:
    torch.manual_seed(0)
    base = {"embed": torch.randn(64, 8), "layer.0.q": torch.randn(8, 8), "layer.0.o": torch.randn(8, 8)}
    same = compare_gradients({k: v.clone() for k, v in base.items()}, base)
    assert same["max_rel_error"] == 0.0 and same["params"] == 3 and same["one_side_only"] == []
    ours = {k: v.clone() for k, v in base.items()}
    ours["layer.0.q"] = base["layer.0.q"] * 1.01  # relative error 1e-2 exactly
    ours["embed"] = base["embed"] + 1e-4 * torch.randn(64, 8)
    got = compare_gradients(ours, base)
    assert got["worst_param"] == "layer.0.q" and got["max_rel_error"] == pytest.approx(1e-2, rel=1e-5)
    assert got["median_rel_error"] == pytest.approx(compare_gradients({"e": ours["embed"]},
                                                                      {"e": base["embed"]})["max_rel_error"])
    assert list(got["largest"])[0] == "layer.0.q"


def test_a_gradient_on_one_side_only_is_the_worst() -> None:
    base = {"a": torch.ones(4), "b": torch.ones(4)}
    got = compare_gradients({"a": torch.ones(4)}, base)
    assert got["max_rel_error"] == float("inf") and got["worst_param"] == "b" and got["one_side_only"] == ["b"]
    with pytest.raises(ValueError, match="no parameter"):
        compare_gradients({"a": torch.ones(4)}, {})


def test_loss_row() -> None:
    assert loss_row(2.02, 2.0)["rel_diff"] == pytest.approx(0.01)
    assert loss_row(0.5, 0.0)["rel_diff"] == 0.5


def _fake_package() -> types.SimpleNamespace:
    autograd = types.SimpleNamespace(_forward=lambda kernel, *a: ("out", "lse"))
    backward = types.SimpleNamespace(run_backward=lambda kind, *a: (kind, "dk", "dv"))
    tuned = types.SimpleNamespace(run=lambda kernel, *a: (kernel, "dk", "dv"))
    return types.SimpleNamespace(_runtime=types.SimpleNamespace(autograd=autograd, backward=backward,
                                                                tuned_backward=tuned))


def test_tuned_calls_counts_what_ran_and_puts_the_functions_back() -> None:
    pkg = _fake_package()
    real_forward, real_backward = pkg._runtime.autograd._forward, pkg._runtime.backward.run_backward
    real_tuned = pkg._runtime.tuned_backward.run
    with tuned_calls(pkg) as counts:
        for _ in range(3):
            assert pkg._runtime.autograd._forward("kernel", 1, 2, 3, None) == ("out", "lse")
        assert pkg._runtime.backward.run_backward("cudnn", 0)[0] == "cudnn"
        pkg._runtime.backward.run_backward("flash", 0)
        assert pkg._runtime.tuned_backward.run("attn_bwd_x", 0)[0] == "attn_bwd_x"
    assert dict(counts) == {"forward": 3, "backward cudnn": 1, "backward flash": 1, "backward tuned": 1}
    assert pkg._runtime.autograd._forward is real_forward and pkg._runtime.backward.run_backward is real_backward
    assert pkg._runtime.tuned_backward.run is real_tuned
    with pytest.raises(RuntimeError), tuned_calls(pkg):
        raise RuntimeError("a failed step")
    assert pkg._runtime.autograd._forward is real_forward


def test_markdown_names_the_ratio_the_worst_gradient_and_what_ran() -> None:
    result = {
        "gpu": "NVIDIA H200", "layers": 4, "vocab": 32000, "batch": 4, "seq": 4096, "reps": 3, "impl": "tuned_train",
        "explain": "pkg.attention(q ...)\n  backward: SDPA cuDNN backward on the tuned forward's O and lse",
        "timing": {"rounds": 7, "ours_ms": 180.0, "sdpa_ms": 190.0, "ours_tok_s": 91022.0, "sdpa_tok_s": 86231.0,
                   "ratio": 1.0555, "ratio_min": 1.04, "ratio_max": 1.07},
        "profile": {"attn_ms_ours": 30.0, "attn_ms_sdpa": 40.0, "attn_share_ours": 0.17, "attn_share_sdpa": 0.21,
                    "tuned_kernel_launches": 4, "sdpa_attention_kernels": {"cudnn_sdpa_fprop": 10.0}},
        "check": {"loss": {"ours": 10.61, "sdpa": 10.62, "rel_diff": 9e-4}, "layers": 4,
                  "gradients": {"params": 39, "max_rel_error": 8e-3, "median_rel_error": 2e-3,
                                "worst_param": "model.layers.0.self_attn.q_proj.weight"},
                  "tuned_calls": {"forward": 4, "backward cudnn": 4},
                  "control": {"FLASH_ATTENTION": {"runs": True, "max_rel_error": 6e-3, "worst_param": "lm_head.weight"},
                              "CUDNN_ATTENTION": {"runs": False, "why": "No available kernel"}}},
    }
    text = markdown(result)
    assert "**1.056x** (1.040-1.070)" in text and "target, the step >= 1.10x SDPA's: not met." in text
    result["timing"]["ratio"] = 1.10
    assert "target, the step >= 1.10x SDPA's: met." in markdown(result)
    assert "max rel. error 8.00e-03 (model.layers.0.self_attn.q_proj.weight)" in text
    assert "flash 6.00e-03 (lm_head.weight); cudnn does not run (No available kernel)" in text
    assert "backward cudnn x4, forward x4 (4 layers)" in text and "launches in the profiled step: 4" in text
    assert "    backward: SDPA cuDNN backward" in text and "vocab cut to 32000" in text
    assert "NOTE" not in text
    result["check"]["tuned_calls"] = {}  # every layer routed to SDPA: said, not hidden
    assert "NOTE: the tuned forward ran in 0 of 4 layers' calls" in markdown(result)


def test_gradient_check_switches_one_model_and_counts_the_tuned_calls(fake_cuda_kernels) -> None:  # noqa: F811
    pytest.importorskip("transformers")
    name = hf.register_transformers("tuned_train_e2e_test")
    model = _llama("sdpa")
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    pkg = types.SimpleNamespace(_runtime=types.SimpleNamespace(autograd=autograd, backward=backward,
                                                               tuned_backward=tuned_backward))
    check = gradient_check(model, pkg, name, training_step(model, ids, labels), control=False)
    layers = model.config.num_hidden_layers
    assert len(fake_cuda_kernels) == layers  # the SDPA step reached none: only ours did
    assert check["tuned_calls"] == {"forward": layers, "backward flash": layers} and check["layers"] == layers
    # The fakes compute in float64 what SDPA computes in float32: the same step.
    assert check["loss"]["rel_diff"] < 1e-6 and check["gradients"]["max_rel_error"] < 1e-4, check
    assert check["gradients"]["params"] == len(list(model.parameters())) and check["control"] == {}
    assert all(p.grad is None for p in model.parameters())  # the check leaves no gradients behind
    assert autograd._forward.__module__ == autograd.__name__  # and the real functions in place
