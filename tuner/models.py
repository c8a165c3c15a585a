"""The attention shapes of a model, and the problems a serving run of it needs tuned.

A model is a named preset shipped with the tool (written from the models' published
configurations; nothing is downloaded) or a Hugging Face `config.json` (a file, or a
folder holding one): query heads, K/V heads, head dim and dtype are all attention needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError


@dataclass(frozen=True)
class ModelShape:
    name: str
    heads: int
    heads_kv: int
    head_dim: int
    dtype: str  # fp16 or bf16

    def describe(self) -> str:
        return f"{self.name}: {self.heads} heads, {self.heads_kv} K/V heads, D{self.head_dim}, {self.dtype}"


PRESETS = {
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 8, 128, "bf16"),
    "llama-3.1-70b": ModelShape("llama-3.1-70b", 64, 8, 128, "bf16"),
    "mistral-7b": ModelShape("mistral-7b", 32, 8, 128, "bf16"),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 4, 128, "bf16"),
}
# Prefill of a serving run: (batch, sequence) from one long prompt to many short ones, causal.
PREFILL = ((1, 16384), (4, 4096), (16, 1024))
# Decode of a serving run: (batch, query rows, context) - a batch at a long context, many short ones, one
# very long sequence, and a speculative-decoding verify step of 4 tokens.
DECODE = ((8, 1, 8192), (64, 1, 1024), (1, 1, 32768), (8, 4, 8192))
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "fp16": "fp16"}


def load_model(name_or_path: str) -> ModelShape:
    """A preset by name (case-insensitive; a hub id such as meta-llama/Llama-3.1-8B finds its preset), or
    the config.json at a path; a one-line TunerError otherwise."""
    text = name_or_path.strip()
    key = text.lower().rsplit("/", 1)[-1].replace("-instruct", "").replace("meta-", "")
    if key in PRESETS:
        return PRESETS[key]
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise TunerError(f"unknown model {text!r}: not a preset ({', '.join(PRESETS)}) nor a config.json file or folder")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TunerError(f"cannot read the model config {path}: {exc}") from None
    return shape_from_config(config, path.parent.name or str(path))


def shape_from_config(config: dict, name: str) -> ModelShape:
    """The attention shape of a transformers config (text_config for multimodal configs)."""
    config = config.get("text_config", config)
    try:
        heads = int(config["num_attention_heads"])
        heads_kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise TunerError(f"model config {name!r} lacks the attention shape ({exc}): it needs num_attention_heads "
                         "and head_dim or hidden_size") from None
    raw = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    if raw not in _DTYPES:
        raise TunerError(f"model {name!r} is in {raw}; the kernels take fp16 or bf16")
    if heads % heads_kv:
        raise TunerError(f"model {name!r}: {heads} heads are not a multiple of {heads_kv} K/V heads")
    return ModelShape(name, heads, heads_kv, head_dim, _DTYPES[raw])


def prefill_shapes(model: ModelShape) -> tuple[str, ...]:
    """The B,H,S,D shapes of the prefill problems of a serving run (causal, the model's K/V heads and dtype)."""
    return tuple(f"{b},{model.heads},{s},{model.head_dim}" for b, s in PREFILL)


def decode_shapes(model: ModelShape) -> tuple[str, ...]:
    """The B,H,Sq,Sk,D shapes of the decode problems of a serving run (the model's heads and head dim)."""
    return tuple(f"{b},{model.heads},{sq},{sk},{model.head_dim}" for b, sq, sk in DECODE)


def serving_shapes(model: ModelShape) -> tuple[str, ...]:
    """Every problem `tuner search --model` tunes: prefill, then decode."""
    return prefill_shapes(model) + decode_shapes(model)
