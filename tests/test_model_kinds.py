"""A model's layer kinds (sliding window, logit softcap) from presets and Hugging Face configs, and the searches
`tuner search --model` runs for them."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_tuner

from tuner.errors import TunerError
from tuner.models import LayerKind, Phase, load_model, model_problems, search_plan, shape_from_config

# The hub's config.json files, trimmed to the keys attention reads (and, for Gemma-3, as sparse as the hub's:
# head_dim, query_pre_attn_scalar and the layer pattern are Gemma3TextConfig's defaults there).
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_size": 3584, "num_attention_heads": 16,
             "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "sliding_window": 4096,
             "torch_dtype": "float32"}  # how the checkpoint is stored; Gemma-2 runs in bf16
GEMMA3_12B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
              "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                              "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}}
MISTRAL_V01 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
               "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("name, config", [("gemma-2-9b", GEMMA2_9B), ("gemma-3-12b", GEMMA3_12B),
                                          ("mistral-7b-v0.1", MISTRAL_V01)])
def test_presets_are_what_their_configs_say(name, config) -> None:
    """transformers' sliding_window W keeps keys q - W < j <= q: window_left W - 1."""
    preset = load_model(name)
    assert shape_from_config({**config, "torch_dtype": "bfloat16"}, name) == preset
    expected = {"gemma-2-9b": (LayerKind(4095, 50.0, 21), LayerKind(-1, 50.0, 21)),
                "gemma-3-12b": (LayerKind(1023, 0.0, 40), LayerKind(-1, 0.0, 8)),
                "mistral-7b-v0.1": (LayerKind(4095, 0.0, 32),)}[name]
    assert preset.kinds == expected and preset.head_dim == (128 if name.startswith("mistral") else 256)
    assert preset.scale == (None if name.startswith("mistral") else 256 ** -0.5)


@pytest.mark.parametrize("hub_id", ["google/gemma-2-9b", "google/gemma-2-9b-it", "google/gemma-3-12b-it",
                                    "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"])
def test_hub_ids_find_the_new_presets(hub_id) -> None:
    assert not load_model(hub_id).plain


def test_qwen2_slides_from_max_window_layers_and_only_with_use_sliding_window() -> None:
    qwen = {"model_type": "qwen2", "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
            "num_hidden_layers": 28, "sliding_window": 4096, "max_window_layers": 21, "torch_dtype": "bfloat16"}
    assert shape_from_config({**qwen, "use_sliding_window": False}, "q").kinds == (LayerKind(-1, 0.0, 28),)
    assert shape_from_config({**qwen, "use_sliding_window": True}, "q").kinds == \
        (LayerKind(-1, 0.0, 21), LayerKind(4095, 0.0, 7))


def test_layer_types_win_and_unknown_ones_are_one_line_errors() -> None:
    base = {"num_attention_heads": 8, "head_dim": 64, "num_hidden_layers": 3, "sliding_window": 128}
    kinds = shape_from_config({**base, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
                              "m").kinds
    assert kinds == (LayerKind(-1, 0.0, 1), LayerKind(127, 0.0, 2))
    assert shape_from_config({**base, "sliding_window_pattern": 3}, "m").kinds == \
        (LayerKind(127, 0.0, 2), LayerKind(-1, 0.0, 1))  # Cohere2 / older Gemma-3 configs: every third is global
    for config, message in (({**base, "layer_types": ["chunked_attention"] * 3}, "'chunked_attention' layers"),
                            ({**base, "sliding_window": None, "layer_types": ["sliding_attention"] * 3},
                             "sliding_window None"),
                            ({**base, "use_bidirectional_attention": True}, "attends bidirectionally")):
        with pytest.raises(TunerError, match=message) as err:
            shape_from_config(config, "m")
        assert "\n" not in str(err.value)


def test_a_mistral_config_without_the_key_slides_as_transformers_defaults_it() -> None:
    config = {k: v for k, v in MISTRAL_V01.items() if k != "sliding_window"}
    assert shape_from_config(config, "m").kinds == (LayerKind(4095, 0.0, 32),)
    assert shape_from_config({**config, "sliding_window": None}, "m").plain  # v0.2 / v0.3


def test_gemma2s_search_plan() -> None:
    """The window where it binds (prefill at 16384 keys, the 4-token verify past a full sliding-window cache),
    elsewhere the windowless problem it equals (shorter prompts, one-token decode steps of a sliding-window
    cache, which holds the window's last W - 1 keys plus the new one); softcap 50 throughout."""
    phases = search_plan(load_model("gemma-2-9b"))
    assert phases == [
        Phase("prefill", ("1,16,16384,256",), (4095, -1), 50.0),
        Phase("prefill", ("4,16,4096,256", "16,16,1024,256", "1,16,16384,256"), (-1, -1), 50.0),
        Phase("decode", ("8,16,1,4096,256", "64,16,1,1024,256", "1,16,1,4096,256", "8,16,1,8192,256",
                         "1,16,1,32768,256", "8,16,4,8192,256"), (-1, -1), 50.0),
        Phase("decode", ("8,16,4,4099,256",), (4095, -1), 50.0)]
    problems = model_problems(load_model("gemma-2-9b"))
    assert [(f"{p.batch},{p.heads},{p.seq_q}" + (f",{p.seq_k}" if p.seq_k != p.seq_q else "") + f",{p.head_dim}",
             (p.window_left, p.window_right), p.softcap) for p in problems] == \
        [(s, phase.window, phase.softcap) for phase in phases for s in phase.shapes]
    assert all(p.causal and p.heads_kv == 8 and p.dtype == "bf16" for p in problems)


def test_a_plain_model_keeps_its_two_searches() -> None:
    phases = search_plan(load_model("llama-3.1-8b"))
    assert [(p.stage, len(p.shapes), p.window, p.softcap) for p in phases] == \
        [("prefill", 3, (-1, -1), 0.0), ("decode", 4, (-1, -1), 0.0)]


def test_search_model_runs_a_search_per_layer_kind(tmp_path) -> None:
    from tuner.backends.synthetic import write_synthetic_recording
    from tuner.problem import problem_from_shape
    from tuner.store import TrialFilter, open_store

    model = load_model("mistral-7b-v0.1")
    phases = search_plan(model)
    problems = {p: [problem_from_shape(s, dtype="bf16", causal=True, heads_kv=8, window=p.window, softcap=p.softcap)
                    for s in p.shapes] for p in phases}
    recording = f"sqlite:///{tmp_path / 'synthetic.db'}"
    for phase, found in problems.items():
        write_synthetic_recording(recording, found, profile="h100",
                                  template="attn_decode" if phase.stage == "decode" else "attn_fwd_wgmma")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "mistral-7b-v0.1", "--backend", "replay",
                       "--from", recording, "--trials", "2", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    assert ("model mistral-7b-v0.1: 32 heads, 8 K/V heads, D128, bf16; layers: 32 sliding_window 4096 (window 4095): "
            "1 causal prefill problem, window 4095 (1,32,16384,128), then 2 causal prefill problems") in result.stderr
    assert "1 decode problem, window 4095 (8,32,4,4099,128)" in result.stderr
    with open_store(db) as store:
        tuned = {r.problem for r in store.query_trials(TrialFilter())}
    assert tuned == {p for found in problems.values() for p in found}
    assert {p.window_left for p in tuned if p.seq_q == 16384} == {4095}  # the long prefill kept its window


def test_a_config_folder_with_a_softcap(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**GEMMA2_9B, "torch_dtype": "bfloat16"}))
    spec = load_model(str(tmp_path))
    assert spec.kinds == load_model("gemma-2-9b").kinds and "softcap 50" in spec.describe()
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_9B))
    with pytest.raises(TunerError, match="is in float32; the kernels take fp16 or bf16"):
        load_model(str(tmp_path))  # the hub file as it is: the preset is the way to its bf16 serving shape


def test_kv_cache_e4m3_tunes_the_decode_steps_over_an_fp8_cache(tmp_path) -> None:
    """--model M --kv-cache e4m3: prefill in the model's dtype, every decode step as <dtype>_kv_e4m3 (stored so);
    --kv-cache without --model, or an unknown cache dtype, is a one-line error."""
    from tuner.backends.synthetic import write_synthetic_recording
    from tuner.problem import problem_from_shape
    from tuner.store import TrialFilter, open_store

    model = load_model("llama-3.1-8b")
    phases = search_plan(model, "e4m3")
    assert [(p.stage, p.dtype) for p in phases] == [("prefill", ""), ("decode", "bf16_kv_e4m3")]
    assert "FP8 KV cache" in phases[1].describe() and search_plan(model, "bf16") == search_plan(model)
    with pytest.raises(TunerError, match="unsupported --kv-cache 'e5m2': e4m3"):
        search_plan(model, "e5m2")
    recording = f"sqlite:///{tmp_path / 'synthetic.db'}"
    for phase in phases:
        found = [problem_from_shape(s, dtype=phase.dtype or "bf16", causal=True, heads_kv=8) for s in phase.shapes]
        write_synthetic_recording(recording, found, profile="h100",
                                  template="attn_decode" if phase.stage == "decode" else "attn_fwd_wgmma")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "llama-3.1-8b", "--kv-cache", "e4m3",
                       "--backend", "replay", "--from", recording, "--trials", "2", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    assert "then 4 decode problems, FP8 KV cache (8,32,1,8192,128," in " ".join(result.stderr.split())
    with open_store(db) as store:
        dtypes = {(r.problem.seq_q > 16, r.problem.dtype) for r in store.query_trials(TrialFilter())}
    assert dtypes == {(True, "bf16"), (False, "bf16_kv_e4m3")}
    alone = run_tuner("--db", db, "search", "--gpu", "h100", "--shape", "8,32,1,8192,128", "--kv-cache", "e4m3")
    assert alone.exit_code == 2 and "--kv-cache sets the decode steps of --model" in alone.stderr


def test_kv_cache_e4m3_on_a_d256_model_is_refused_before_any_search(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "gemma-2-9b", "--kv-cache", "e4m3")
    assert result.exit_code == 2
    assert "--kv-cache e4m3: the FP8 cache's decode kernels take head dim 128; gemma-2-9b has D256" in result.stderr
    assert not (tmp_path / "r.db").exists()  # nothing ran, nothing was stored
