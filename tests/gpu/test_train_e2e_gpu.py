"""benchmarks/train_e2e.py on a GPU, small: a tiny Llama (2 layers, hidden 512, 32 heads over 8 K/V heads of D128,
bf16) at B2 S256, one training step through register_transformers() and one through transformers' SDPA path on the
same model object: losses equal within tolerance, every parameter's gradient close to SDPA's and no farther from an
fp32 copy's than SDPA's are, and the tuned forward kernel run in every layer (counted at the call and as kernel
launches in a profiled step: not a silent SDPA fallback) with a backward on its O and lse. Then the script's main()
end to end on one full-width layer with the same package (the layers' problem is the same: H32 Hkv8 S256 D128).

    PYTHONPATH=$PWD python -m pytest -m gpu tests/gpu/test_train_e2e_gpu.py -s
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import pytest

from benchmarks.model_e2e import attention_ms, build_model
from benchmarks.train_e2e import (compare_gradients, gradient_check, gradients, layer_problem, main, tokens,
                                  training_step)
from tests.gpu.one_trial_export import export_one_trial

pytestmark = pytest.mark.gpu

TINY = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_attention_heads=32, num_key_value_heads=8,
            head_dim=128, max_position_embeddings=1024)
LAYERS, BATCH, SEQ = 2, 2, 256
BACKWARDS = {"backward cudnn", "backward flash"}


@pytest.fixture(scope="module")
def package(gpu_profile, tmp_path_factory):
    """An export holding one trial of the layers' problem (the card's template, its first covering variant)."""
    pytest.importorskip("transformers")
    from tuner.kernels.feasibility import covering_sample, default_template

    problem = layer_problem(TINY, BATCH, SEQ)
    variant = covering_sample(default_template(gpu_profile, [problem]), problem, gpu_profile)[0]
    return export_one_trial(gpu_profile, tmp_path_factory.mktemp("train_e2e_gpu"), problem, variant, 100.0, 2e-3)


def test_one_training_step_matches_sdpa_and_runs_the_tuned_kernel(package) -> None:
    impl = package.register_transformers(f"tuned_train_{uuid.uuid4().hex[:6]}")
    model = build_model(LAYERS, **TINY).train()
    ids, labels = tokens(TINY["vocab_size"], BATCH, SEQ, seed=0)
    step = training_step(model, ids, labels)
    check = gradient_check(model, package, impl, step, control=False)
    calls = check["tuned_calls"]
    assert calls.get("forward") == LAYERS, f"the tuned forward ran {calls} in {LAYERS} layers"
    assert set(calls) - {"forward"} <= BACKWARDS and sum(calls[k] for k in BACKWARDS if k in calls) == LAYERS, calls
    _, _, launches, _ = attention_ms(model, impl, step, set(package.MANIFEST["kernels"]))
    assert launches == LAYERS, f"{launches} launches of the tuned kernel in a profiled step of {LAYERS} layers"
    assert check["loss"]["rel_diff"] < 1e-2, check["loss"]
    grads = check["gradients"]
    assert grads["params"] == len(list(model.parameters())) and not grads["one_side_only"]
    assert grads["max_rel_error"] < 5e-2, grads  # two bf16 models; the fp32 anchor below is the sharper check

    # Against an fp32 copy (same weights, SDPA in fp32): ours may not drift farther than transformers' SDPA path.
    model.set_attn_implementation(impl)
    step()
    ours = gradients(model)
    model.set_attn_implementation("sdpa")
    step()
    sdpa = gradients(model)
    ref = copy.deepcopy(model).float()
    ref.set_attn_implementation("sdpa")
    training_step(ref, ids, labels)()
    exact = gradients(ref)
    ours_err, sdpa_err = compare_gradients(ours, exact), compare_gradients(sdpa, exact)
    assert ours_err["max_rel_error"] <= 2 * sdpa_err["max_rel_error"] + 2e-3, (ours_err, sdpa_err)


def test_the_script_end_to_end_on_one_full_width_layer(package, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "train.json"
    main(["--package", str(Path(package.__file__).parent), "--layers", "1", "--batch", str(BATCH), "--seq", str(SEQ),
          "--vocab", "1024", "--rounds", "2", "--reps", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    check = result["check"]
    assert check["tuned_calls"].get("forward") == 1 and result["profile"]["tuned_kernel_launches"] == 1, check
    assert check["gradients"]["max_rel_error"] < 5e-2 and check["loss"]["rel_diff"] < 1e-2, check
    assert set(check["control"]) == {"FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"}
    assert result["timing"]["rounds"] == 2 and result["timing"]["ratio"] > 0
    backward = [line for line in result["explain"].splitlines() if "backward:" in line]
    assert backward and "backward: SDPA (the whole call" not in backward[0], result["explain"]
    assert "| ours (tuned_train) |" in capsys.readouterr().out
