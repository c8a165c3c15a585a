"""Train through an exported package in a fresh process, with torch alone (the tuner is not imported here): run by
tests/gpu/test_export_backward_gpu.py.

    python tests/gpu/backward_package_run.py OUT NAME CASES_JSON RESULT_PT

For each case (JSON: b, h, hkv, sq, sk, d, dtype, causal, layout, seed) attention() runs forward and backward on
fresh leaves and dO; the inputs, dO, the gradients, explain()'s text and the backward the runtime chose are saved.
The first case is also captured in a CUDA graph (forward and backward, after an eager warm-up on a side stream) and
replayed on new data copied into its static inputs: those inputs and the replayed gradients are saved too.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import torch


def leaves(case: dict[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v (leaves requiring grad, BHSD or BSHD views) and dO, drawn from `seed`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, case["dtype"])

    def draw(heads: int, seq: int, grad: bool = True) -> torch.Tensor:
        if case["layout"] == "bshd":
            t = torch.randn(case["b"], seq, heads, case["d"], generator=gen, device="cuda").to(dtype).transpose(1, 2)
        else:
            t = torch.randn(case["b"], heads, seq, case["d"], generator=gen, device="cuda").to(dtype)
        return t.requires_grad_(grad)

    return (draw(case["h"], case["sq"]), draw(case["hkv"], case["sk"]), draw(case["hkv"], case["sk"]),
            draw(case["h"], case["sq"], grad=False))


def cpu(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().cpu() for t in tensors]


def train(pkg: Any, backward: Any, case: dict[str, Any]) -> dict[str, Any]:
    q, k, v, do = leaves(case, case["seed"])
    choice = backward.device_backward(q, case["causal"], k)
    out = pkg.attention(q, k, v, causal=case["causal"])
    out.backward(do)
    torch.cuda.synchronize()
    return {"inputs": cpu(q, k, v, do), "grads": cpu(q.grad, k.grad, v.grad), "kind": choice.kind,
            "kernel": choice.kernel, "explain": str(pkg.explain(q, k, v, causal=case["causal"])),
            "layouts": [list(t.stride()) == list(g.stride()) for t, g in ((q, q.grad), (k, k.grad), (v, v.grad))]}


def graphed(pkg: Any, case: dict[str, Any]) -> dict[str, Any]:
    q, k, v, do = leaves(case, case["seed"])

    def step() -> None:
        pkg.attention(q, k, v, causal=case["causal"]).backward(do)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: loads the kernels, caches the workspaces and TMA-free paths
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    fresh = leaves(case, case["seed"] + 1000)
    with torch.no_grad():
        for static, new in zip((q, k, v, do), fresh):
            static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    return {"inputs": cpu(q, k, v, do), "grads": cpu(q.grad, k.grad, v.grad)}


def main(out: str, name: str, cases_json: str, result: str) -> None:
    sys.path.insert(0, out)
    pkg = importlib.import_module(name)
    backward = importlib.import_module(f"{name}._runtime.backward")
    cases = json.loads(cases_json)
    saved = {"cases": [train(pkg, backward, c) for c in cases], "graph": graphed(pkg, cases[0]),
             "tuner_imported": sorted(m for m in sys.modules if m == "tuner" or m.startswith("tuner."))}
    torch.save(saved, result)


if __name__ == "__main__":
    main(*sys.argv[1:5])
