"""A stand-in for the cuDNN frontend's `cudnn` module (the parts sdpa_fp8 uses), for the cuDNN FP8 baseline's
tests run without a GPU: graphs record how they were declared, built and executed."""

from __future__ import annotations

import sys
import types
from typing import Any, Optional

ORDER = ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans")


class GraphNotSupported(Exception):
    """cudnn.cudnnGraphNotSupportedError's stand-in."""


class FakeTensor:
    def __init__(self, uid: Optional[int] = None, dim: Any = None, stride: Any = None, data_type: Any = None):
        self.uid, self.dim, self.stride, self.data_type, self.output = uid, dim, stride, data_type, False

    def set_uid(self, uid: int) -> "FakeTensor":
        self.uid = uid
        return self

    def set_output(self, value: bool) -> "FakeTensor":
        self.output = value
        return self

    def set_dim(self, dim: Any) -> "FakeTensor":
        self.dim = tuple(dim)
        return self

    def set_stride(self, stride: Any) -> "FakeTensor":
        self.stride = tuple(stride)
        return self

    def set_data_type(self, data_type: Any) -> "FakeTensor":
        self.data_type = data_type
        return self


class FakeGraph:
    def __init__(self, module: "FakeCudnn", **kwargs: Any):
        self.module, self.kwargs = module, kwargs
        self.tensors: dict[int, FakeTensor] = {}
        self.steps: list[str] = []
        self.heuristics: Any = None
        self.sdpa_args: tuple = ()
        self.sdpa_kwargs: dict = {}
        self.outputs: tuple = ()
        self.executions: list[tuple] = []
        module.graphs.append(self)

    def tensor(self, uid: int, dim: Any, stride: Any, data_type: Any) -> FakeTensor:
        self.tensors[uid] = FakeTensor(uid, tuple(dim), tuple(stride), data_type)
        return self.tensors[uid]

    def sdpa_fp8(self, *args: Any, **kwargs: Any) -> tuple:
        self.sdpa_args, self.sdpa_kwargs = args, kwargs
        self.outputs = (FakeTensor(), None, FakeTensor(), FakeTensor())
        return self.outputs

    def _step(self, name: str) -> None:
        self.steps.append(name)
        out = self.outputs[0]
        if name == self.module.decline_at and out.data_type in self.module.declined_out:
            raise GraphNotSupported(f"sdpa fp8 forward with {out.data_type} output is not supported\nsecond line")

    def validate(self) -> None:
        self._step("validate")

    def build_operation_graph(self) -> None:
        self._step("build_operation_graph")

    def create_execution_plans(self, heuristics: Any) -> None:
        self.heuristics = list(heuristics)
        self._step("create_execution_plans")

    def check_support(self) -> None:
        self._step("check_support")

    def build_plans(self) -> None:
        self._step("build_plans")

    def get_workspace_size(self) -> int:
        return 256

    def execute(self, pack: dict, workspace: Any, handle: Any = None) -> None:
        assert self.steps == list(ORDER), "executed before it was built"
        self.executions.append((pack, workspace, handle))
        written = pack[self.outputs[0].uid]
        written.copy_(self.module.result.to(written.dtype).expand_as(written))


class FakeCudnn(types.ModuleType):
    """`cudnn` as the baseline sees it. `declined_out`: output data types the graph declines at step
    `decline_at`; `result`: the value execute writes into O (broadcast)."""

    def __init__(self) -> None:
        super().__init__("cudnn")
        self.data_type = types.SimpleNamespace(FP8_E4M3="FP8_E4M3", FP8_E5M2="FP8_E5M2", FLOAT="FLOAT",
                                               BFLOAT16="BFLOAT16")
        self.heur_mode = types.SimpleNamespace(A="heur_A", FALLBACK="heur_FALLBACK")
        self.diagonal_alignment = types.SimpleNamespace(TOP_LEFT="TOP_LEFT", BOTTOM_RIGHT="BOTTOM_RIGHT")
        self.cudnnGraphNotSupportedError = GraphNotSupported
        self.graphs: list[FakeGraph] = []
        self.handles: list[dict] = []
        self.decline_at = "check_support"
        self.declined_out: set = set()
        self.result: Any = None

    def pygraph(self, **kwargs: Any) -> FakeGraph:
        return FakeGraph(self, **kwargs)

    def create_handle(self) -> dict:
        self.handles.append({"stream": None})
        return self.handles[-1]

    def set_stream(self, handle: dict, stream: int) -> None:
        handle["stream"] = stream


def install_fake_cudnn(monkeypatch) -> FakeCudnn:
    """`import cudnn` gives a FakeCudnn for one test."""
    module = FakeCudnn()
    monkeypatch.setitem(sys.modules, "cudnn", module)
    return module
