"""End to end: a Llama-style model with an exported package's attention against torch SDPA, one process.

    python benchmarks/model_e2e.py --package OUT/NAME [--layers 8] [--rounds 7] [--json e2e.json]
    python benchmarks/model_e2e.py --package OUT/NAME --model mistral-7b-v0.1 [--layers 4]

--model mistral-7b-v0.1 runs Mistral-7B-v0.1's shape instead (sliding window 4096 in every layer, vocab
32000): prefill at B1 S16384 only, its kernel alone against SDPA with the window's boolean mask (what
transformers' SDPA path computes), and the last position's logits against SDPA's and a control.

The model has Llama-3.1-8B's published shape (hidden 4096, 32 heads over 8 K/V heads, head dim 128,
MLP 14336, vocab 128256), `--layers` of them, random weights (nothing is downloaded), bf16 on the GPU.
One model object switches implementation (set_attn_implementation) between timings, so the weights are
the same. Every figure is a median of per-round ratios, the implementations interleaved in each round.

- prefill: tokens/s of a forward without cache (logits of the last position only) at B4 S4096 and B1 S16384;
- attention share: CUDA time of the attention kernels in one profiled forward of each implementation;
- kernel ratio: the attention call alone at the layers' shape (what transformers' SDPA path calls);
- decode: B8 at context 8192, static cache, one decode step captured in a CUDA graph and replayed (the
  package reads the cache's key lengths; transformers' SDPA path masks the whole cache, and with a mask it
  repeats K/V per query head); its kernel ratio is against SDPA at its best: exact keys, no mask, GQA native;
- greedy: 32 tokens generated from one prompt by each implementation (dynamic cache), compared.

A training step (forward + backward) of the same model: train_e2e.py, which builds it with build_model.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
                max_position_embeddings=32768)
MISTRAL_V01 = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                   max_position_embeddings=32768, sliding_window=4096)
PREFILL = ((4, 4096), (1, 16384))
MISTRAL_PREFILL = ((1, 16384),)
DECODE = (8, 8192)
SDPA_KERNEL = re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)


def load_package(path: str) -> Any:
    """The package exported to `path`: its importable folder (OUT/NAME) or the export's --out folder (OUT, which
    holds pyproject.toml and NAME/)."""
    folder = Path(path).resolve()
    if (folder / "pyproject.toml").is_file() and (folder / folder.name / "__init__.py").is_file():
        folder = folder / folder.name
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module(folder.name)


def build_model(layers: int, model: str = "llama-3.1-8b", **overrides: Any) -> Any:
    """`layers` of the model's shape, random weights (seed 0), bf16 on the GPU, in eval mode; `overrides` replace
    config fields (a cut vocab, a tiny test shape). Each call makes its own config: transformers keeps the object
    and attn_implementation= is set on it (see tests/test_hf_training_route.py)."""
    import transformers

    if model == "mistral-7b-v0.1":
        cfg = transformers.MistralConfig(num_hidden_layers=layers, **{**MISTRAL_V01, **overrides})
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=layers, **{**LLAMA_8B, **overrides})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.eval()


def event_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median of `reps` timings of fn (one warm-up call first)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def back_to_back_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median ms of `reps` calls of fn issued back to back (an event between consecutive calls, one host wait at
    the end; one warm-up call first): the GPU is not left idle between calls, as in a training loop."""
    fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for event in events[1:]:
        fn()
        event.record()
    events[-1].synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(events, events[1:]))


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, reps: int,
                setups: dict[str, Callable[[], Any]] | None = None,
                clocks: dict[str, list[float]] | None = None,
                timer: Callable[[Callable[[], Any], int], float] = event_ms) -> dict[str, list[float]]:
    """ms per call of each fn, round by round, the fns interleaved within each round; `setups[name]` runs
    before fn's timings in each round, outside them (switching the model's attention implementation is
    host work on an idle GPU, not part of a forward). `clocks[name]` (if given) gets the SM clock (MHz)
    and power (W) sampled while fn was timed. `timer(fn, reps)`: ms of one call (event_ms, back_to_back_ms)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if setups:
                setups[name]()
            with ClockSampler() as sampler:
                out[name].append(timer(fn, reps))
            if clocks is not None:
                clocks.setdefault(name, []).extend(sampler.samples)
    return out


class ClockSampler:
    """(SM clock MHz, power W) every 5 ms in a thread, through torch's NVML wrappers; none without NVML."""

    def __enter__(self) -> "ClockSampler":
        import threading

        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            try:
                self.samples.append((float(torch.cuda.clock_rate()), float(torch.cuda.power_draw()) / 1000.0))
            except Exception:  # no pynvml / NVML here: no samples
                return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def clock_summary(samples: list[tuple[float, float]]) -> dict[str, float | None]:
    if not samples:
        return {"sm_mhz": None, "power_w": None}
    return {"sm_mhz": statistics.mean(c for c, _ in samples), "power_w": statistics.mean(w for _, w in samples)}


def ratio_of(times: dict[str, list[float]], ours: str, base: str) -> float:
    """Median per-round speed-up of `ours` over `base` (> 1: ours is faster)."""
    return statistics.median(b / o for o, b in zip(times[ours], times[base]))


def switch_ms(model: Any, impl: str, times: int = 5) -> float:
    """Host ms of one model.set_attn_implementation(impl) (what the timings used to include)."""
    import time

    start = time.perf_counter()
    for _ in range(times):
        model.set_attn_implementation(impl)
    return (time.perf_counter() - start) / times * 1e3


def attention_ms(model: Any, impl: str, fn: Callable[[], Any], ours: set[str],
                 per_kernel: dict[str, float] | None = None) -> tuple[float, float, int, float]:
    """(attention kernel ms, all kernels ms, tuned-kernel launches, ms from the first kernel's start to the
    last one's end) in one profiled call of fn; `per_kernel` (if given) gets the ms of every kernel name.
    The span minus the kernel time is the GPU's idle time between kernels."""
    from torch.profiler import ProfilerActivity, profile

    model.set_attn_implementation(impl)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    attn = total = 0.0
    launches = 0
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if getattr(ev, "device_type", None) is not None and "CUDA" not in str(ev.device_type):
            continue
        total += t
        if per_kernel is not None:
            per_kernel[ev.key] = per_kernel.get(ev.key, 0.0) + t / 1000.0
        tuned = any(ev.key.startswith(n) for n in ours)
        if tuned or SDPA_KERNEL.search(ev.key):
            attn += t
        launches += ev.count if tuned else 0
    ranges = [(ev.time_range.start, ev.time_range.end) for ev in prof.events()
              if "CUDA" in str(getattr(ev, "device_type", "")) and ev.time_range.end > ev.time_range.start]
    span = (max(e for _, e in ranges) - min(b for b, _ in ranges)) / 1000.0 if ranges else 0.0
    return attn / 1000.0, total / 1000.0, launches, span


def kernel_differences(k_ours: dict[str, float], k_sdpa: dict[str, float], top: int = 8) -> dict[str, float]:
    """ms per kernel name (its first 90 characters; names that share them are summed), ours - SDPA,
    the largest differences first: what the end-to-end ratio holds besides attention."""
    diff: dict[str, float] = {}
    for name in set(k_ours) | set(k_sdpa):
        diff[name[:90]] = diff.get(name[:90], 0.0) + k_ours.get(name, 0.0) - k_sdpa.get(name, 0.0)
    return dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top])


def prefill_rows(model: Any, pkg: Any, impl: str, rounds: int,
                 shapes: tuple[tuple[int, int], ...] = PREFILL) -> list[dict[str, Any]]:
    rows = []
    ours = set(pkg.MANIFEST["kernels"])
    cfg = model.config
    window = getattr(cfg, "sliding_window", None)
    for b, s in shapes:
        ids = torch.randint(0, cfg.vocab_size, (b, s), device="cuda")

        def forward() -> Any:
            with torch.inference_mode():
                return model(input_ids=ids, use_cache=False, logits_to_keep=1)

        clocks: dict[str, list[Any]] = {}
        kernel_clocks: dict[str, list[Any]] = {}
        times = interleaved({"ours": forward, "sdpa": forward}, rounds, reps=3,
                            setups={"ours": lambda: model.set_attn_implementation(impl),
                                    "sdpa": lambda: model.set_attn_implementation("sdpa")}, clocks=clocks)
        q = torch.randn(b, cfg.num_attention_heads, s, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, cfg.num_key_value_heads, s, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        with torch.inference_mode():
            if window and window < s:  # transformers' window: q - window < j <= q, i.e. window_size (window - 1, 0)
                i = torch.arange(s, device="cuda")
                keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
                ours_fn = lambda: pkg.attention(q, k, v, causal=True, window_size=(window - 1, 0))  # noqa: E731
                sdpa_fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                    q, k, v, attn_mask=keep, enable_gqa=True)
            else:
                ours_fn = lambda: pkg.attention(q, k, v, causal=True)  # noqa: E731
                sdpa_fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                    q, k, v, is_causal=True, enable_gqa=True)
            kernel = interleaved({"ours": ours_fn, "sdpa": sdpa_fn}, rounds, reps=5, clocks=kernel_clocks)
        k_ours: dict[str, float] = {}
        k_sdpa: dict[str, float] = {}
        a_ours, t_ours, launches, span_ours = attention_ms(model, impl, forward, ours, k_ours)
        a_sdpa, t_sdpa, _, span_sdpa = attention_ms(model, "sdpa", forward, ours, k_sdpa)
        rows.append({
            "shape": f"B{b} S{s}",
            **compared(b * s, times, kernel, (a_ours, t_ours, launches), (a_sdpa, t_sdpa), k_ours, k_sdpa),
            "ours_ms": statistics.median(times["ours"]), "sdpa_ms": statistics.median(times["sdpa"]),
            "gpu_idle_ms_ours": span_ours - t_ours, "gpu_idle_ms_sdpa": span_sdpa - t_sdpa,
            "switch_host_ms_ours": switch_ms(model, impl), "switch_host_ms_sdpa": switch_ms(model, "sdpa"),
            "clock_ours": clock_summary(clocks.get("ours", [])), "clock_sdpa": clock_summary(clocks.get("sdpa", [])),
            "kernel_clock_ours": clock_summary(kernel_clocks.get("ours", [])),
            "kernel_clock_sdpa": clock_summary(kernel_clocks.get("sdpa", [])),
        })
        print(json.dumps(rows[-1], indent=1), flush=True)
    return rows


def decode_row(model: Any, pkg: Any, impl: str, rounds: int, steps: int = 32) -> dict[str, Any]:
    """Decode tokens/s with a static cache, one step captured in a CUDA graph per implementation; the
    attention kernels' share of a profiled run of each; the kernel alone against SDPA at its best."""
    import transformers

    b, ctx = DECODE
    cfg = model.config
    graphs = {}
    for name in (impl, "sdpa"):
        model.set_attn_implementation(name)
        cache = transformers.StaticCache(config=cfg, max_cache_len=ctx + steps + 8)
        prompt = torch.randint(0, cfg.vocab_size, (b, ctx), device="cuda")
        tok = torch.zeros(b, 1, dtype=torch.long, device="cuda")
        pos = torch.full((1,), ctx, dtype=torch.long, device="cuda")
        with torch.inference_mode():
            model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(ctx, device="cuda"),
                  logits_to_keep=1)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(input_ids=tok, past_key_values=cache, cache_position=pos, logits_to_keep=1)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(input_ids=tok, past_key_values=cache, cache_position=pos, logits_to_keep=1)

        def run(graph=graph, pos=pos, cache=cache) -> None:
            with torch.inference_mode():  # the cache's tensors were made in inference mode
                for layer in cache.layers:  # the layers count their length on the GPU, inside the graph
                    layer.cumulative_length.fill_(ctx)
                for i in range(steps):
                    pos.fill_(ctx + i)
                    graph.replay()

        graphs[name] = run
    times = interleaved({"ours": graphs[impl], "sdpa": graphs["sdpa"]}, rounds, reps=3)
    ours = set(pkg.MANIFEST["kernels"])
    k_ours: dict[str, float] = {}
    k_sdpa: dict[str, float] = {}
    a_ours, t_ours, launches, _ = attention_ms(model, impl, graphs[impl], ours, k_ours)
    a_sdpa, t_sdpa, _, _ = attention_ms(model, "sdpa", graphs["sdpa"], ours, k_sdpa)
    kernel = decode_kernel_times(pkg, cfg, b, ctx + steps + 8, ctx, rounds)
    return {"shape": f"B{b} ctx{ctx}", "steps": steps,
            **compared(b * steps, times, kernel, (a_ours, t_ours, launches), (a_sdpa, t_sdpa), k_ours, k_sdpa)}


def compared(tokens: int, times: dict[str, list[float]], kernel: dict[str, list[float]],
             ours: tuple[float, float, int], sdpa: tuple[float, float], k_ours: dict[str, float],
             k_sdpa: dict[str, float]) -> dict[str, Any]:
    """The figures every row reports: tokens/s and the end-to-end ratio (`times`, ms per call of `tokens`
    tokens), the kernel alone (`kernel`, ms), the profiled (attention ms, all kernels ms[, tuned launches])
    of each implementation and where their kernels differ."""
    (a_ours, t_ours, launches), (a_sdpa, t_sdpa) = ours, sdpa
    return {"tokens": tokens,
            "ours_tok_s": tokens / statistics.median(times["ours"]) * 1e3,
            "sdpa_tok_s": tokens / statistics.median(times["sdpa"]) * 1e3,
            "e2e_ratio": ratio_of(times, "ours", "sdpa"),
            "kernel_ratio": ratio_of(kernel, "ours", "sdpa"),
            "kernel_ours_us": statistics.median(kernel["ours"]) * 1e3,
            "kernel_sdpa_us": statistics.median(kernel["sdpa"]) * 1e3,
            "attn_share_ours": a_ours / t_ours, "attn_share_sdpa": a_sdpa / t_sdpa,
            "in_model_attn_ratio": a_sdpa / a_ours if a_ours else None,
            "tuned_kernel_launches": launches,
            "profiled_ms_ours": t_ours, "profiled_ms_sdpa": t_sdpa,
            "largest_kernel_differences_ms": kernel_differences(k_ours, k_sdpa)}


def decode_kernel_times(pkg: Any, cfg: Any, b: int, slots: int, ctx: int, rounds: int) -> dict[str, list[float]]:
    """One decode step's attention alone: the package on the static cache's slots with key lengths (what
    the model runs) against SDPA at its best, the fastest backend on exactly `ctx` keys, GQA native, no mask
    (what SDPA could do without a static cache)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(b, cfg.num_attention_heads, 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, cfg.num_key_value_heads, slots, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    ke, ve = k[:, :, :ctx], v[:, :, :ctx]

    def sdpa(backend: Any) -> Callable[[], Any]:
        def run() -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, ke, ve, enable_gqa=True)
        return run

    with torch.inference_mode():
        fns = {"ours": lambda: pkg.attention(q, k, v, causal=True, seq_lens=lens)}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                sdpa(backend)()
                fns[name] = sdpa(backend)
            except RuntimeError:
                pass  # a backend this card or build lacks
        times = interleaved(fns, rounds, reps=20)
    # Per round, the faster SDPA backend of that round.
    times["sdpa"] = [min(times[n][i] for n in fns if n != "ours") for i in range(rounds)]
    return times


def greedy_row(model: Any, pkg: Any, impl: str, tokens: int = 32, prompt_len: int = 4096) -> dict[str, Any]:
    """Greedy generation from one prompt with each implementation; which kernel the prompt's prefill ran."""
    cfg = model.config
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(1))
    q = torch.empty(1, cfg.num_attention_heads, prompt_len, cfg.head_dim, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(1, cfg.num_key_value_heads, prompt_len, cfg.head_dim, device="meta", dtype=torch.bfloat16)
    prefill = pkg.explain(q, kv, kv, causal=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs = {}
    # The control: SDPA's flash backend against SDPA's default choice, the same model: how far two correct
    # bf16 attentions drift apart in greedy decoding with random weights (near-tied logits).
    for label, name, backends in ((impl, impl, None), ("sdpa", "sdpa", None),
                                  ("sdpa_flash", "sdpa", [SDPBackend.FLASH_ATTENTION])):
        model.set_attn_implementation(name)
        with torch.inference_mode(), (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
            outs[label] = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                         output_scores=True, return_dict_in_generate=True, eos_token_id=None,
                                         pad_token_id=0)

    def same_prefix(x: str, y: str) -> int:  # tokens equal before the first difference
        a, b = outs[x].sequences[0, prompt_len:], outs[y].sequences[0, prompt_len:]
        return int((a == b).long().cumprod(0).sum())

    a, b = outs[impl].sequences[0, prompt_len:], outs["sdpa"].sequences[0, prompt_len:]
    same = same_prefix(impl, "sdpa")
    control = same_prefix("sdpa_flash", "sdpa")
    first = outs[impl].scores[0].float(), outs["sdpa"].scores[0].float()
    flash_first = outs["sdpa_flash"].scores[0].float()
    return {"tokens": tokens, "prompt": prompt_len, "prefill_kernel": prefill.kernel,
            "prefill_routed_to_sdpa": "routed to SDPA" in str(prefill),
            "identical": bool(torch.equal(a, b)), "same_prefix": same, "control_same_prefix": control,
            "control_first_logits_max_abs_diff": float((flash_first - first[1]).abs().max()),
            "first_logits_max_abs_diff": float((first[0] - first[1]).abs().max()),
            "first_logits_max_abs": float(first[1].abs().max())}


def logits_row(model: Any, impl: str, shape: tuple[int, int]) -> dict[str, Any]:
    """The last position's logits of one forward with each implementation, and a control: SDPA's two masked
    backends (memory-efficient, cuDNN) against each other, how far two correct bf16 attentions drift."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, s = shape
    ids = torch.randint(0, model.config.vocab_size, (b, s), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(2))
    logits = {}
    for label, name, backend in ((impl, impl, None), ("sdpa", "sdpa", None),
                                 ("sdpa_efficient", "sdpa", SDPBackend.EFFICIENT_ATTENTION),
                                 ("sdpa_cudnn", "sdpa", SDPBackend.CUDNN_ATTENTION)):
        model.set_attn_implementation(name)
        try:
            with torch.inference_mode(), (sdpa_kernel([backend]) if backend else contextlib.nullcontext()):
                logits[label] = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits.float()
        except RuntimeError as exc:  # a backend this build lacks for the mask
            logits[label] = None
            print(f"{label}: {exc}".splitlines()[0], flush=True)
    ref = logits["sdpa"]

    def diff(x: str, y: str) -> float | None:
        return None if logits[x] is None or logits[y] is None else float((logits[x] - logits[y]).abs().max())

    return {"shape": f"B{b} S{s}", "max_abs_logit": float(ref.abs().max()),
            "ours_vs_sdpa": diff(impl, "sdpa"), "control_efficient_vs_cudnn": diff("sdpa_efficient", "sdpa_cudnn"),
            "ours_vs_efficient": diff(impl, "sdpa_efficient")}


def prefill_table(title: str, result: dict[str, Any]) -> list[str]:
    """The markdown heading and prefill rows every model's table starts with."""
    lines = [f"{result['gpu']}, {result['layers']} layers of {title}, bf16, random weights; {result['rounds']} "
             "interleaved rounds, median per-round ratios.", "",
             "| run | ours tok/s | SDPA tok/s | end to end | kernel alone | in model | attention share (ours / SDPA) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["prefill"]:
        inside = f"{r['in_model_attn_ratio']:.3f}x" if r["in_model_attn_ratio"] else "n/a"
        lines.append(f"| prefill {r['shape']} | {r['ours_tok_s']:,.0f} | {r['sdpa_tok_s']:,.0f} | "
                     f"**{r['e2e_ratio']:.3f}x** | {r['kernel_ratio']:.3f}x | {inside} | "
                     f"{r['attn_share_ours']:.1%} / {r['attn_share_sdpa']:.1%} |")
    return lines


def mistral_markdown(result: dict[str, Any]) -> str:
    lines = prefill_table("Mistral-7B-v0.1's shape (sliding window 4096)", result)
    g = result["logits"]
    lines += ["", f"Last-position logits ({g['shape']}): ours vs SDPA max |diff| {g['ours_vs_sdpa']}, of max |logit| "
                  f"{g['max_abs_logit']:.3g}; control, SDPA memory-efficient vs cuDNN: {g['control_efficient_vs_cudnn']}."]
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    lines = prefill_table("Llama-3.1-8B's shape", result)
    d = result["decode"]
    inside = f"{d['in_model_attn_ratio']:.3f}x" if d["in_model_attn_ratio"] else "n/a"
    lines.append(f"| decode {d['shape']} (graph) | {d['ours_tok_s']:,.0f} | {d['sdpa_tok_s']:,.0f} | "
                 f"**{d['e2e_ratio']:.3f}x** | {d['kernel_ratio']:.3f}x | {inside} | "
                 f"{d['attn_share_ours']:.1%} / {d['attn_share_sdpa']:.1%} |")
    g = result["greedy"]
    ran = "SDPA (routed)" if g["prefill_routed_to_sdpa"] else g["prefill_kernel"]
    lines += ["", f"Greedy {g['tokens']} tokens after a {g['prompt']}-token prompt (its prefill ran {ran}): "
                  f"identical {g['identical']} (first {g['same_prefix']} equal); "
                  f"first-step logits max |diff| {g['first_logits_max_abs_diff']:.3g} of max |logit| "
                  f"{g['first_logits_max_abs']:.3g}. Control, SDPA flash against SDPA's default: first "
                  f"{g['control_same_prefix']} equal, first-step max |diff| {g['control_first_logits_max_abs_diff']:.3g}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="folder of an exported package (OUT/NAME)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--model", default="llama-3.1-8b", choices=("llama-3.1-8b", "mistral-7b-v0.1"))
    args = parser.parse_args()
    pkg = load_package(args.package)
    impl = pkg.register_transformers("tuned_e2e")
    model = build_model(args.layers, args.model)
    result = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "rounds": args.rounds,
              "package": pkg.MANIFEST["package"], "model": args.model}
    if args.model == "mistral-7b-v0.1":
        result["prefill"] = prefill_rows(model, pkg, impl, args.rounds, MISTRAL_PREFILL)
        result["logits"] = logits_row(model, impl, MISTRAL_PREFILL[0])
        print(json.dumps(result["logits"]), flush=True)
        print(mistral_markdown(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return
    # Each part is printed as it is measured: a failure later keeps the figures already taken.
    result["prefill"] = prefill_rows(model, pkg, impl, args.rounds)
    result["decode"] = decode_row(model, pkg, impl, args.rounds)
    print(json.dumps(result["decode"]), flush=True)
    result["greedy"] = greedy_row(model, pkg, impl)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
