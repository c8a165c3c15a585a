"""Model presets and Hugging Face configs: the attention shapes a model's serving run needs tuned."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_tuner

from tuner.errors import TunerError
from tuner.models import PREFILL, PRESETS, ModelShape, decode_shapes, load_model, prefill_shapes


@pytest.mark.parametrize("name,heads,kv", [("llama-3.1-8b", 32, 8), ("Llama-3.1-70B", 64, 8),
                                           ("mistralai/Mistral-7B", 32, 8), ("Qwen/Qwen2.5-7B", 28, 4),
                                           ("meta-llama/Llama-3.1-8B-Instruct", 32, 8)])
def test_presets_by_name_or_hub_id(name, heads, kv) -> None:
    model = load_model(name)
    assert (model.heads, model.heads_kv, model.head_dim, model.dtype) == (heads, kv, 128, "bf16")


def test_a_config_json_gives_heads_kv_heads_head_dim_and_dtype(tmp_path) -> None:
    config = {"num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 2048, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path)) == ModelShape(tmp_path.name, 16, 4, 128, "fp16")  # a folder: its config.json
    config.update(head_dim=64)  # an explicit head_dim wins over hidden_size / heads
    (tmp_path / "config.json").write_text(json.dumps({"text_config": config}))
    assert load_model(str(tmp_path / "config.json")).head_dim == 64


@pytest.mark.parametrize("config,message", [({"hidden_size": 64}, "lacks the attention shape"),
                                            ({"num_attention_heads": 8, "head_dim": 64, "torch_dtype": "float32"},
                                             "float32"),
                                            ({"num_attention_heads": 8, "num_key_value_heads": 3, "head_dim": 64},
                                             "not a multiple")])
def test_configs_it_cannot_use_are_one_line_errors(tmp_path, config, message) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TunerError, match=message):
        load_model(str(tmp_path))
    with pytest.raises(TunerError, match="not a preset"):
        load_model(str(tmp_path / "missing"))


def test_prefill_problems_of_a_model() -> None:
    shapes = prefill_shapes(PRESETS["qwen2.5-7b"])
    assert shapes == tuple(f"{b},28,{s},128" for b, s in PREFILL)


def test_search_and_export_take_a_model_and_refuse_it_with_shapes(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    both = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "llama-3.1-8b", "--shape", "1,8,512,64")
    assert both.exit_code == 2 and "do not pass --shape, --hkv or --study with it" in both.stderr
    unknown = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "gpt-17")
    assert unknown.exit_code == 2 and "unknown model 'gpt-17'" in unknown.stderr
    export = run_tuner("--db", db, "export", "--gpu", "h100", "--out", str(tmp_path / "o"), "--model", "mistral-7b",
                       "--all")
    assert export.exit_code == 2 and "give one of --shape, --all and --model" in export.stderr
    out = ["--db", db, "export", "--gpu", "h100", "--out", str(tmp_path / "o")]
    dtype = run_tuner(*out, "--model", "mistral-7b", "--dtype", "bf16_kv_e4m3")
    assert dtype.exit_code == 2 and "--model sets the dtype of its problems" in dtype.stderr  # it was ignored
    cache = run_tuner(*out, "--shape", "8,32,1,8192,128", "--kv-cache", "e4m3")
    assert cache.exit_code == 2 and "--kv-cache describes --model's decode steps" in cache.stderr
    assert not (tmp_path / "o").exists()


def test_search_model_tunes_its_causal_prefill_problems(tmp_path) -> None:
    from tuner.backends.synthetic import write_synthetic_recording
    from tuner.problem import problem_from_shape
    from tuner.store import TrialFilter, open_store

    model = PRESETS["mistral-7b"]
    prefill, decode = ([problem_from_shape(s, dtype=model.dtype, causal=True, heads_kv=model.heads_kv) for s in shapes]
                       for shapes in (prefill_shapes(model), decode_shapes(model)))
    recording = f"sqlite:///{tmp_path / 'synthetic.db'}"
    write_synthetic_recording(recording, prefill, profile="h100", template="attn_fwd_wgmma")
    write_synthetic_recording(recording, decode, profile="h100", template="attn_decode")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tuner("--db", db, "search", "--gpu", "h100", "--model", "mistral-7b", "--backend", "replay",
                       "--from", recording, "--trials", "2", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    assert "model mistral-7b: 32 heads, 8 K/V heads, D128, bf16: 3 causal prefill problems" in result.stderr
    assert "then 4 decode problems" in result.stderr
    with open_store(db) as store:
        templates = {r.problem: r.template for r in store.query_trials(TrialFilter())}
    # Each set is searched with its own template: the decode one for the short queries.
    assert templates == {**{p: "attn_fwd_wgmma" for p in prefill}, **{p: "attn_decode" for p in decode}}
