"""The dtype registry (tuner/dtypes.py): its shipped copy matches it, and no module keeps a table of its own."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tuner import dtypes
from tuner.dtypes import SPECS, spec
from tuner.errors import TunerError

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"


def test_the_shipped_copy_is_generated_from_the_registry() -> None:
    """A change to tuner/dtypes.py without `python -m tuner.dtypes` (or a hand edit of the copy) fails here."""
    assert dtypes.SHIPPED_COPY.read_text(encoding="utf-8") == dtypes.shipped_source(), \
        "tuner/runtime/shipped/dtypes.py differs from the registry: run `python -m tuner.dtypes`"


def test_the_shipped_copy_states_the_registry_facts() -> None:
    """Loaded as the runtime loads it (no tuner import), every field is the registry's."""
    loaded = importlib.util.spec_from_file_location("shipped_dtypes", dtypes.SHIPPED_COPY)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    assert module.ELEMENTS == {e.name: vars(e) for e in dtypes.ELEMENTS.values()}
    for name, s in SPECS.items():
        copy = module.DTYPES[name]
        assert copy["code"] == s.code and copy["tolerance"] == s.tolerance and copy["template_arg"] == s.template_arg
        assert [copy[k] for k in ("query", "kv", "output", "compute", "baseline")] == \
            [s.query.name, s.kv.name, s.output.name, s.compute.name, s.baseline.name]
    assert list(module.DTYPES) == list(SPECS)


def test_write_shipped_copy_writes_only_a_change(tmp_path: Path) -> None:
    path = tmp_path / "dtypes.py"
    assert dtypes.write_shipped_copy(path) and path.read_text() == dtypes.shipped_source()
    assert not dtypes.write_shipped_copy(path)


# What exports, stores and headers already hold: a refactor of the registry must not move any of it.
PUBLISHED = {  # name: header code, template argument, header Element / Output, k/v bytes, torch q, tolerance
    "fp16": (0, "half", "half", "half", 2, "float16", 2e-3),
    "bf16": (1, "__nv_bfloat16", "__nv_bfloat16", "__nv_bfloat16", 2, "bfloat16", 1e-2),
    "e4m3": (2, "__nv_fp8_e4m3", "__nv_fp8_e4m3", "__nv_bfloat16", 1, "float8_e4m3fn", 5e-2),
    "fp16_kv_e4m3": (3, "fc::KvE4m3<half>", "half", "half", 1, "float16", 2e-3),
    "bf16_kv_e4m3": (4, "fc::KvE4m3<__nv_bfloat16>", "__nv_bfloat16", "__nv_bfloat16", 1, "bfloat16", 1e-2),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_facts_stay(name: str) -> None:
    s = spec(name)
    assert (s.code, s.template_arg, s.query.cxx, s.output.cxx, s.kv.bytes, s.query.torch, s.tolerance) == \
        PUBLISHED[name]


def test_codes_are_unique_and_kinds_follow_the_types() -> None:
    assert len({s.code for s in SPECS.values()}) == len(SPECS)
    assert [n for n, s in SPECS.items() if s.fp8] == ["e4m3", "fp16_kv_e4m3", "bf16_kv_e4m3"]
    assert [n for n, s in SPECS.items() if s.fp8_kv] == ["fp16_kv_e4m3", "bf16_kv_e4m3"]
    with pytest.raises(TunerError, match="unknown dtype 'fp32'"):
        spec("fp32")


# The modules that once kept a dtype table of their own (issue 39): each reads the registry now.
CONSUMERS = ("problem.py", "runtime/verify.py", "kernels/render.py", "kernels/feasibility.py", "export/header.py",
             "export/package.py", "export/check.py", "profiles/profile.py", "backends/synthetic.py",
             "runtime/baselines.py", "runtime/shipped/choice.py", "runtime/shipped/cuda_driver.py")
REGISTRY = ("dtypes.py", "runtime/shipped/dtypes.py")
# Tables that are not the registry's facts: Hugging Face's spellings of a model's torch_dtype (config.json).
NOT_DTYPE_TABLES: set[tuple[str, str]] = set()  # (module, table) pairs the scan may skip: none now


def _spellings() -> set[str]:
    """Every way the tree spells a dtype fact: names, torch names (bare and torch.-qualified), C++ types."""
    names = set(SPECS) | {s.template_arg for s in SPECS.values()}
    for e in dtypes.ELEMENTS.values():
        names |= {e.name, e.torch, f"torch.{e.torch}", e.cxx}
    return names


def _dtype_tables(path: Path) -> list[str]:
    """Literal dicts, tuples, lists and sets in `path` holding two or more dtype spellings (keys or values;
    torch.float16-style attributes count), by the name they are assigned to."""
    spellings, found = _spellings(), []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = {id(n.value): n.targets[0] for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.targets}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            items = [*node.keys, *node.values]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        else:
            continue
        hits = [ast.unparse(i).strip("'\"") for i in items if i is not None]
        if sum(h in spellings for h in hits) >= 2:
            target = owner.get(id(node))
            found.append(ast.unparse(target) if target is not None else f"line {node.lineno}")
    return found


def test_no_module_keeps_a_dtype_table_of_its_own() -> None:
    """Adding a dtype touches the registry and the kernels only: a second table would be a place to miss."""
    tables = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in REGISTRY:
            tables += [f"{rel}: {t}" for t in _dtype_tables(path) if (rel, t) not in NOT_DTYPE_TABLES]
    assert not tables, "dtype tables outside tuner/dtypes.py (read the registry instead): " + ", ".join(tables)


def test_the_scan_finds_a_table(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text('X = {"fp16": 1, "bf16": 2}\nimport torch\nY = {torch.float16: 6, torch.bfloat16: 9}\n'
                    'Z = ("e4m3", "__nv_fp8_e4m3")\nW = {"fp16": "half"}\n')
    assert _dtype_tables(path) == ["X", "Y", "Z", "W"]


@pytest.mark.parametrize("rel", CONSUMERS)
def test_the_former_table_keepers_read_the_registry(rel: str) -> None:
    imported = set()
    for node in ast.walk(ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    assert imported & {"tuner.dtypes", ".dtypes"}, f"{rel} no longer reads the dtype registry"
