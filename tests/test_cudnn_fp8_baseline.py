"""cuDNN's FP8 attention forward as a baseline, without a GPU: a stand-in `cudnn` module records the graph the
baseline declares (scale, causality, descales, layouts), that it is built once and the timed call only
executes it, and the reasons given where there is no baseline."""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
from cudnn_fakes import ORDER, install_fake_cudnn

import tuner.runtime.cudnn_fp8 as cf

torch = pytest.importorskip("torch")
E4M3 = torch.float8_e4m3fn


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake cudnn, a fake CUDA device of capability `state["capability"]` (CPU tensors stand in for the
    card's), stream 7."""
    module = install_fake_cudnn(monkeypatch)
    module.result = torch.tensor(2.0)
    state = {"capability": (9, 0)}
    monkeypatch.setattr(cf, "device_capability", lambda tensor: state["capability"])
    monkeypatch.setattr(cf, "_handles", {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setenv("TUNER_LOG_DIR", str(tmp_path / "log"))
    return module, state


def _qkv(b=2, h=8, hkv=2, sq=64, sk=64, d=128, dtype=E4M3):
    """q [B, H, Sq, D], k, v [B, Hkv, Sk, D]: BSHD tensors seen as BHSD (as a model holds them)."""
    q = torch.randn(b, sq, h, d).to(dtype).transpose(1, 2)
    k = torch.randn(b, sk, hkv, d).to(dtype).transpose(1, 2)
    v = torch.randn(b, sk, hkv, d).to(dtype).transpose(1, 2)
    return q, k, v


def _descales(b=2, hkv=2, values=(0.5, 0.25, 0.125)):
    return tuple(torch.full((b, hkv), value) for value in values)


def test_the_graph_is_built_once_and_the_call_only_executes_it(fake) -> None:
    module, _ = fake
    q, k, v = _qkv()
    name, call = cf.cudnn_fp8_baseline(q, k, v, _descales(), causal=False, scale=0.125)
    assert name == cf.CUDNN_FP8 == "cudnn_fp8"
    for _ in range(3):
        call()
    [graph] = module.graphs
    assert graph.steps == list(ORDER)  # built once, in the frontend's order
    assert graph.heuristics == ["heur_A", "heur_FALLBACK"]
    assert len(graph.executions) == 4  # the check at build, then the three calls
    packs, workspaces, handles = zip(*graph.executions)
    assert all(p is packs[0] for p in packs) and all(w is workspaces[0] for w in workspaces)
    assert all(h is module.handles[0] for h in handles) and module.handles == [{"stream": 7}]
    assert workspaces[0].numel() == 256 and workspaces[0].dtype == torch.uint8
    assert graph.kwargs["handle"] is module.handles[0]


def test_scale_causality_and_layouts_reach_the_graph(fake) -> None:
    module, _ = fake
    q, k, v = _qkv(sq=64, sk=64)
    cf.build_cudnn_fp8(q, k, v, _descales(), causal=True, scale=0.125)
    [graph] = module.graphs
    assert graph.sdpa_kwargs == {"generate_stats": False, "attn_scale": 0.125,
                                 "diagonal_alignment": "TOP_LEFT", "right_bound": 0}
    q_t, k_t, v_t, *scalars = graph.sdpa_args
    assert (q_t.uid, q_t.dim, q_t.stride, q_t.data_type) == (cf.Q, (2, 8, 64, 128), tuple(q.stride()), "FP8_E4M3")
    assert (k_t.dim, k_t.stride) == ((2, 2, 64, 128), tuple(k.stride())) and v_t.uid == cf.V
    assert [s.uid for s in scalars] == list(cf.SCALARS)
    assert all(s.dim == (1, 1, 1, 1) and s.data_type == "FLOAT" for s in scalars)
    assert graph.kwargs["io_data_type"] == "FP8_E4M3" and graph.kwargs["compute_data_type"] == "FLOAT"
    o, _, amax_s, amax_o = graph.outputs
    assert (o.uid, o.output, o.dim) == (cf.O, True, (2, 8, 64, 128))
    assert o.stride == (64 * 8 * 128, 128, 8 * 128, 1)  # [B, Sq, H, D] in memory
    assert (amax_s.uid, amax_o.uid, amax_s.output, amax_o.output) == (cf.AMAX_S, cf.AMAX_O, True, True)

    module.graphs.clear()
    cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)  # no mask; the default scale is 1/sqrt(D)
    assert module.graphs[0].sdpa_kwargs == {"generate_stats": False, "attn_scale": 128 ** -0.5}


def test_descales_are_per_tensor_views_of_element_0_0(fake) -> None:
    """cuDNN takes one descale per tensor: the [B, Hkv] descales' first element, read in place (no copy)."""
    module, _ = fake
    q, k, v = _qkv()
    descales = _descales()
    cf.build_cudnn_fp8(q, k, v, descales, causal=False)
    pack = module.graphs[0].executions[0][0]
    for uid, given in zip((cf.DESCALE_Q, cf.DESCALE_K, cf.DESCALE_V), descales):
        assert pack[uid].shape == (1, 1, 1, 1) and pack[uid].data_ptr() == given.data_ptr()
    assert pack[cf.SCALE_S].item() == 448.0 and pack[cf.DESCALE_S].item() == pytest.approx(1 / 448)
    assert pack[cf.SCALE_O].item() == 8.0  # O written in V's FP8 range: 1 / descale_v
    given_numbers = cf.build_cudnn_fp8(q, k, v, (1.0, 2.0, 0.5), causal=False)
    assert not isinstance(given_numbers, str)
    assert module.graphs[1].executions[0][0][cf.DESCALE_K].item() == 2.0


def test_on_hopper_fp8_output_is_converted_to_bf16(fake) -> None:
    module, _ = fake
    q, k, v = _qkv()
    built = cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)
    assert built.out_dtype == "float8_e4m3fn"
    assert module.graphs[0].outputs[0].data_type == "FP8_E4M3"
    out = built.call()
    assert out is built.out and out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 8, 64, 128)
    assert (out == 2.0 * 0.125).all()  # O_fp8 times descale_v
    written = built.graph_call()
    assert written.dtype == E4M3 and (written.float() == 2.0).all()


def test_on_blackwell_cudnn_writes_bf16_or_falls_back_to_fp8(fake) -> None:
    module, state = fake
    state["capability"] = (10, 0)
    q, k, v = _qkv()
    built = cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)
    assert built.out_dtype == "bfloat16" and built.call is built.graph_call and len(module.graphs) == 1
    assert (built.call() == 2.0).all()

    module.graphs.clear()
    module.declined_out = {"BFLOAT16"}  # cuDNN before 9.13
    built = cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)
    assert built.out_dtype == "float8_e4m3fn" and len(module.graphs) == 2
    assert module.graphs[0].steps == list(ORDER[:4]) and module.graphs[1].steps == list(ORDER)


def test_causal_with_fewer_queries_is_bottom_right_on_blackwell(fake) -> None:
    module, state = fake
    state["capability"] = (10, 0)
    q, k, v = _qkv(sq=16, sk=64)
    assert not isinstance(cf.build_cudnn_fp8(q, k, v, _descales(), causal=True), str)
    assert module.graphs[0].sdpa_kwargs["diagonal_alignment"] == "BOTTOM_RIGHT"


def test_the_sanity_output_is_a_copy(fake) -> None:
    q, k, v = _qkv()
    out = cf.cudnn_fp8_output(q, k, v, _descales(), causal=False)
    assert out.dtype == torch.bfloat16 and (out == 0.25).all()
    built = cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)
    assert out.data_ptr() != built.out.data_ptr()


def test_one_handle_per_device_and_stream(fake) -> None:
    module, _ = fake
    q, k, v = _qkv()
    cf.build_cudnn_fp8(q, k, v, _descales(), causal=False)
    cf.build_cudnn_fp8(q, k, v, _descales(), causal=True)
    assert len(module.handles) == 1 and len(module.graphs) == 2


# --- no baseline, and why -----------------------------------------------------------------------------

def test_reason_when_the_frontend_is_not_installed(fake, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import fails
    q, k, v = _qkv()
    assert cf.cudnn_fp8_baseline(q, k, v, _descales(), causal=False) == cf.MISSING
    assert cf.cudnn_fp8_output(q, k, v, _descales(), causal=False) == cf.MISSING
    assert "nvidia-cudnn-frontend" in cf.MISSING


def test_reason_when_the_frontend_is_there_but_does_not_load(fake, monkeypatch, tmp_path) -> None:
    package = tmp_path / "site" / "cudnn"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('GLIBCXX_3.4.32 not found (required by _compiled_module)')")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "cudnn")
    q, k, v = _qkv()
    assert cf.cudnn_fp8_baseline(q, k, v, _descales(), causal=False) == (
        "cuDNN frontend does not import here: ImportError: GLIBCXX_3.4.32 not found (required by _compiled_module)")
    sys.modules.pop("cudnn", None)


def test_reason_when_cudnn_declines_the_graph(fake) -> None:
    module, _ = fake
    module.declined_out = {"FP8_E4M3"}
    q, k, v = _qkv()
    reason = cf.cudnn_fp8_baseline(q, k, v, _descales(), causal=False)
    assert reason == ("cuDNN's FP8 attention does not run this problem: GraphNotSupported: sdpa fp8 forward "
                      "with FP8_E4M3 output is not supported second line")


@pytest.mark.parametrize(("shape", "capability", "causal", "expected"), [
    ({}, (8, 9), False, "needs Hopper or Blackwell (sm90+); this GPU is sm89"),
    ({"d": 72}, (9, 0), False, "multiples of 16 up to 256 on sm90, not 72/72"),
    ({"d": 256}, (10, 0), False, "multiples of 16 up to 128 on sm100, not 256/256"),
    ({"h": 8, "hkv": 3}, (9, 0), False, "H (8) a multiple of Hkv (3)"),
    ({"sq": 16, "sk": 64}, (9, 0), True, "no bottom-right causal mask on Hopper"),
    ({"dtype": torch.bfloat16}, (9, 0), False, "one FP8 type (float8_e4m3fn or float8_e5m2), not ['bfloat16']"),
])
def test_reasons_for_problems_it_does_not_take(fake, shape, capability, causal, expected) -> None:
    module, state = fake
    state["capability"] = capability
    q, k, v = _qkv(**shape)
    reason = cf.cudnn_fp8_baseline(q, k, v, _descales(hkv=k.shape[1]), causal=causal)
    assert isinstance(reason, str) and expected in reason
    assert module.graphs == []  # decided before any graph is declared


def test_what_it_takes(fake) -> None:
    """GQA, MQA, head dim 256 on Hopper, causal with fewer queries on Blackwell, e5m2."""
    q, k, v = _qkv(h=8, hkv=1, d=256)
    assert cf.unsupported_reason(q, k, v, False, (9, 0)) is None
    q, k, v = _qkv(sq=16, sk=64, dtype=torch.float8_e5m2)
    assert cf.unsupported_reason(q, k, v, True, (10, 0)) is None
    assert "head dim contiguous" in cf.unsupported_reason(q, k, v.transpose(2, 3), False, (9, 0))


def test_cpu_tensors_are_not_a_baseline(monkeypatch) -> None:
    install_fake_cudnn(monkeypatch)
    q, k, v = _qkv()
    assert cf.device_capability(q) is None
    assert cf.cudnn_fp8_baseline(q, k, v, _descales(), causal=False) == "cuDNN FP8 attention needs CUDA tensors"


def test_an_e4m3_problem_gets_cudnn_fp8_after_its_bf16_baselines(fake) -> None:
    """fp8_baselines wires it in for a plain dense e4m3 problem, not where the graph cannot take the mask."""
    from tuner.problem import Problem
    from tuner.runtime.baselines import fp8_baselines

    q, k, v = _qkv()
    plain = Problem(2, 8, 64, 64, 128, dtype="e4m3", heads_kv=2)
    found = fp8_baselines(plain, q, k, v, None, _descales())
    assert [b.name for b in found] == ["cudnn_fp8"] and found[0].backend is None
    for masked in (Problem(2, 8, 64, 64, 128, dtype="e4m3", heads_kv=2, causal=True, window_left=16),
                   Problem(2, 8, 64, 64, 128, dtype="e4m3", heads_kv=2, softcap=30.0)):
        assert fp8_baselines(masked, q, k, v, None, _descales()) == []
