"""The attention shapes of a model, and the problems a serving run of it needs tuned.

A model is a named preset shipped with the tool (written from the models' published
configurations; nothing is downloaded) or a Hugging Face `config.json` (a file, or a
folder holding one): query heads, K/V heads, head dim and dtype are all attention needs,
and its layer kinds: full attention or a sliding window, with or without a logit softcap
(Mistral-7B-v0.1, Gemma-2/3, Qwen2 with use_sliding_window). Each kind is its own search:
a kernel compiles its window and softcap in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tuner.dtypes import ELEMENTS
from tuner.errors import TunerError
from tuner.problem import KV_E4M3, Problem, problem_from_shape, window_text


@dataclass(frozen=True)
class LayerKind:
    """Layers that attend alike. window_left: the keys before the query a sliding-window layer sees
    (FlashAttention's window_size left bound; transformers' sliding_window W keeps q - W < j <= q, so W - 1),
    -1 for full attention; softcap: attn_logit_softcapping (0: none); layers: how many (0: not stated)."""

    window_left: int = -1
    softcap: float = 0.0
    layers: int = 0

    @property
    def window(self) -> tuple[int, int]:
        """As SearchOptions.window takes it: causal layers have no right bound."""
        return (self.window_left, -1)

    def label(self) -> str:
        count = f"{self.layers} " if self.layers else ""
        what = (f"sliding_window {self.window_left + 1} (window {self.window_left})" if self.window_left >= 0
                else "full attention")
        return f"{count}{what}" + (f" softcap {self.softcap:g}" if self.softcap else "")


@dataclass(frozen=True)
class ModelShape:
    name: str
    heads: int
    heads_kv: int
    head_dim: int
    dtype: str  # fp16 or bf16
    kinds: tuple[LayerKind, ...] = (LayerKind(),)
    # The softmax scale where the config sets one (Gemma: query_pre_attn_scalar ** -0.5). The kernels take the
    # scale at run time, so it changes no tuned kernel; it is shown so that a user passes it.
    scale: Optional[float] = None

    @property
    def plain(self) -> bool:
        """Every layer full attention without a softcap: one prefill and one decode search, as ever."""
        return all(k.window_left < 0 and not k.softcap for k in self.kinds)

    def describe(self) -> str:
        kinds = "" if self.plain else "; layers: " + ", ".join(k.label() for k in self.kinds)
        scale = f"; softmax scale {self.scale:.6g}" if self.scale else ""
        return f"{self.name}: {self.heads} heads, {self.heads_kv} K/V heads, D{self.head_dim}, {self.dtype}{kinds}{scale}"


PRESETS = {
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 8, 128, "bf16"),
    "llama-3.1-70b": ModelShape("llama-3.1-70b", 64, 8, 128, "bf16"),
    "mistral-7b": ModelShape("mistral-7b", 32, 8, 128, "bf16"),  # v0.3: sliding_window null
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 4, 128, "bf16"),  # use_sliding_window false
    # google/gemma-2-9b config.json: 42 layers, 16 heads, 8 K/V heads, head_dim 256, sliding_window 4096 on
    # alternate layers (Gemma2Config's layer_types: layer i slides iff i is even), attn_logit_softcapping 50.0,
    # query_pre_attn_scalar 256. Its torch_dtype is float32 (how the checkpoint is stored); it runs in bf16.
    "gemma-2-9b": ModelShape("gemma-2-9b", 16, 8, 256, "bf16", (LayerKind(4095, 50.0, 21), LayerKind(-1, 50.0, 21)),
                             256 ** -0.5),
    # google/gemma-3-12b-it config.json (text_config): 48 layers, 16 heads, 8 K/V heads, sliding_window 1024;
    # Gemma3TextConfig's defaults for the rest: head_dim 256 (not hidden_size 3840 / 16), sliding_window_pattern
    # 6 (five local layers, then a global one), no attention softcap, query_pre_attn_scalar 256; bfloat16.
    "gemma-3-12b": ModelShape("gemma-3-12b", 16, 8, 256, "bf16", (LayerKind(1023, 0.0, 40), LayerKind(-1, 0.0, 8)),
                              256 ** -0.5),
    # mistralai/Mistral-7B-v0.1 config.json: 32 layers, 32 heads, 8 K/V heads, hidden_size 4096 (head_dim 128),
    # sliding_window 4096 on every layer, bfloat16.
    "mistral-7b-v0.1": ModelShape("mistral-7b-v0.1", 32, 8, 128, "bf16", (LayerKind(4095, 0.0, 32),)),
}
# Prefill of a serving run: (batch, sequence) from one long prompt to many short ones, causal.
PREFILL = ((1, 16384), (4, 4096), (16, 1024))
# Decode of a serving run: (batch, query rows, context) - a batch at a long context, many short ones, one
# very long sequence, and a speculative-decoding verify step of 4 tokens.
DECODE = ((8, 1, 8192), (64, 1, 1024), (1, 1, 32768), (8, 4, 8192))
# A model's dtype as its config spells it (torch's name, ours, or torch's alias `half`) -> ours: the registry's
# 16-bit elements (the kernels take FP8 only as a KV cache or with per-head scales, never as a model's dtype).
_DTYPES = {alias: e.name for e in ELEMENTS.values() if e.bytes == 2 for alias in (e.torch, e.name)}
_DTYPES["half"] = _DTYPES["float16"]  # torch.half, torch's other name of float16
# transformers' config-class defaults (configuration_<model>.py, 5.x) of the attention keys a hub config.json
# may leave out, by model_type: a Gemma-3 config states neither its head_dim nor its layer pattern.
_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"head_dim": 256},
    "gemma2": {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
               "sliding_window_pattern": 2},
    "gemma3_text": {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    "mistral": {"sliding_window": 4096},  # Mistral-7B-v0.2/v0.3 say null
}


def load_model(name_or_path: str) -> ModelShape:
    """A preset by name (case-insensitive; a hub id such as meta-llama/Llama-3.1-8B finds its preset), or
    the config.json at a path; a one-line TunerError otherwise."""
    text = name_or_path.strip()
    key = text.lower().rsplit("/", 1)[-1].replace("-instruct", "").replace("meta-", "").removesuffix("-it")
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
    """The attention shape of a transformers config (text_config for multimodal configs), its layer kinds and
    softmax scale; keys the config leaves out take transformers' defaults for its model_type."""
    top = config
    config = config.get("text_config", config)
    model_type = str(config.get("model_type") or top.get("model_type") or "")
    config = {**_CONFIG_DEFAULTS.get({"gemma3": "gemma3_text"}.get(model_type, model_type), {}), **config}
    try:
        heads = int(config["num_attention_heads"])
        heads_kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise TunerError(f"model config {name!r} lacks the attention shape ({exc}): it needs num_attention_heads "
                         "and head_dim or hidden_size") from None
    raw = str(config.get("torch_dtype") or config.get("dtype") or top.get("torch_dtype") or top.get("dtype")
              or "bfloat16").removeprefix("torch.")
    if raw not in _DTYPES:
        raise TunerError(f"model {name!r} is in {raw}; the kernels take {' or '.join(dict.fromkeys(_DTYPES.values()))}")
    if heads % heads_kv:
        raise TunerError(f"model {name!r}: {heads} heads are not a multiple of {heads_kv} K/V heads")
    if config.get("use_bidirectional_attention"):
        raise TunerError(f"model {name!r} attends bidirectionally; `--model` tunes causal decoders")
    scalar = config.get("query_pre_attn_scalar")
    return ModelShape(name, heads, heads_kv, head_dim, _DTYPES[raw], layer_kinds(config, name),
                      float(scalar) ** -0.5 if scalar else None)


def layer_kinds(config: dict, name: str = "model") -> tuple[LayerKind, ...]:
    """The distinct layer kinds of a (text) config, in order of first appearance, with their layer counts."""
    softcap = float(config.get("attn_logit_softcapping") or 0.0)
    types = _layer_types(config)
    counts: dict[int, int] = {}
    for layer_type in types:
        if layer_type not in ("full_attention", "sliding_attention"):
            raise TunerError(f"model {name!r} has {layer_type!r} layers; `--model` tunes full_attention and "
                             "sliding_attention layers")
        window = config.get("sliding_window") if layer_type == "sliding_attention" else None
        if layer_type == "sliding_attention" and not (isinstance(window, int) and window >= 1):
            raise TunerError(f"model {name!r} has sliding_attention layers but sliding_window {window!r}")
        left = window - 1 if window else -1  # transformers keeps q - W < j <= q: window_size (W - 1, 0)
        counts[left] = counts.get(left, 0) + 1
    if not counts:  # no layer count stated: one kind, as the keys say
        window = config.get("sliding_window")
        return (LayerKind(window - 1 if isinstance(window, int) and window >= 1 else -1, softcap),)
    return tuple(LayerKind(left, softcap, n) for left, n in counts.items())


def _layer_types(config: dict) -> list[str]:
    """config's layer_types, or what transformers derives from the older keys: Qwen2's use_sliding_window and
    max_window_layers (layers from that index slide), sliding_window_pattern (layer i slides unless (i + 1) is a
    multiple of it: Gemma-2 2, Gemma-3 6), else every layer slides when sliding_window is set (Mistral-7B-v0.1)."""
    if config.get("layer_types"):
        return list(config["layer_types"])
    n = int(config.get("num_hidden_layers") or 0)
    window = config.get("sliding_window")
    if "use_sliding_window" in config:
        slide = bool(config["use_sliding_window"]) and window is not None
        first = int(config.get("max_window_layers", 28))
        return ["sliding_attention" if slide and i >= first else "full_attention" for i in range(n)]
    if window is None:
        return ["full_attention"] * n
    pattern = int(config.get("sliding_window_pattern") or 0)
    return ["sliding_attention" if not pattern or (i + 1) % pattern else "full_attention" for i in range(n)]


@dataclass(frozen=True)
class Phase:
    """One search of `tuner search --model`: problems of one stage, window and softcap (one template each)."""

    stage: str  # "prefill" or "decode"
    shapes: tuple[str, ...]
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dtype: str = ""  # the problems' dtype where it is not the search's (decode over an FP8 KV cache)

    def describe(self) -> str:
        mask = (f", window {window_text(self.window[0], self.window[1], True)}" if self.window[0] >= 0 else "") \
            + (f", softcap {self.softcap:g}" if self.softcap else "") \
            + (", FP8 KV cache" if self.dtype.endswith(KV_E4M3) else "")
        causal = "causal " if self.stage == "prefill" else ""
        plural = "" if len(self.shapes) == 1 else "s"
        return f"{len(self.shapes)} {causal}{self.stage} problem{plural}{mask} ({', '.join(self.shapes)})"


def binds(window_left: int, keys: int) -> bool:
    """Whether a causal window of `window_left` hides any of `keys` keys from a query aligned to their end: the
    last query sees keys - 1 - window_left .. keys - 1. Where it cannot, the windowless problem is the same."""
    return window_left >= 0 and keys > window_left + 1


def search_plan(model: ModelShape, kv_cache: str = "") -> list[Phase]:
    """The searches `tuner search --model` runs: prefill phases, then decode.

    Per layer kind, prefill at PREFILL and decode at DECODE, each with the kind's softcap and with its window
    where the window binds (shorter prompts, and the decode steps of a sliding-window cache, which holds the
    window's last W - 1 keys plus the new ones, are the windowless problem: tuned without it). kv_cache "e4m3":
    the decode steps read an FP8 KV cache (dtype <model dtype>_kv_e4m3); "" or the model's dtype: its own."""
    if kv_cache not in ("", model.dtype, "e4m3"):
        raise TunerError(f"unsupported --kv-cache {kv_cache!r}: e4m3 (an FP8 KV cache) or {model.dtype} (the model's)")
    decode_dtype = model.dtype + KV_E4M3 if kv_cache == "e4m3" else ""
    phases: dict[tuple, list[str]] = {}

    def add(stage: str, window: tuple[int, int], softcap: float, shape: str) -> None:
        shapes = phases.setdefault((stage, window, softcap), [])
        if shape not in shapes:
            shapes.append(shape)

    for kind in model.kinds:
        for b, s in PREFILL:
            window = kind.window if binds(kind.window_left, s) else (-1, -1)
            add("prefill", window, kind.softcap, f"{b},{model.heads},{s},{model.head_dim}")
    for kind in model.kinds:
        for b, sq, ctx in DECODE:
            keys = min(ctx, kind.window_left + sq) if kind.window_left >= 0 else ctx
            window = kind.window if binds(kind.window_left, keys) else (-1, -1)
            add("decode", window, kind.softcap, f"{b},{model.heads},{sq},{keys},{model.head_dim}")
    ordered = sorted(phases.items(), key=lambda item: item[0][0] != "prefill")  # stable: prefill, then decode
    return [Phase(stage, tuple(shapes), window, softcap, decode_dtype if stage == "decode" else "")
            for (stage, window, softcap), shapes in ordered]


def prefill_shapes(model: ModelShape) -> tuple[str, ...]:
    """The B,H,S,D shapes of the prefill problems of a serving run (causal, the model's K/V heads and dtype)."""
    return tuple(f"{b},{model.heads},{s},{model.head_dim}" for b, s in PREFILL)


def decode_shapes(model: ModelShape) -> tuple[str, ...]:
    """The B,H,Sq,Sk,D shapes of the decode problems of a serving run (the model's heads and head dim)."""
    return tuple(f"{b},{model.heads},{sq},{sk},{model.head_dim}" for b, sq, sk in DECODE)


def model_problems(model: ModelShape, kv_cache: str = "") -> tuple[Problem, ...]:
    """The problems `tuner search --model` (with --kv-cache) tunes, causal, each with its phase's window, softcap
    and dtype and the model's K/V heads (in the default layout: a search's --layout and --lengths are its own)."""
    return tuple(problem_from_shape(s, dtype=phase.dtype or model.dtype, causal=True, heads_kv=model.heads_kv,
                                    window=phase.window, softcap=phase.softcap)
                 for phase in search_plan(model, kv_cache) for s in phase.shapes)
