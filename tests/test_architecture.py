"""The package's shape, checked: imports form no cycle, modules and functions stay small.

Every import of a `tuner` module counts, wherever it is written (module top,
inside a function, under TYPE_CHECKING): an import moved into a function does
not make a cycle go away, it only hides it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"
# The flow of a trial, bottom to top: a module may import its own layer and the ones below.
LAYERS = (
    ("tuner", "tuner.errors", "tuner.dtypes", "tuner.problem", "tuner.status", "tuner.assets", "tuner.models",
     "tuner.stop_signals"),  # domain types every layer uses; the stop signals every command shares
    # The runtime exports ship imports nothing from tuner (checked below), so it sits at the bottom: the
    # profiles' device query opens the driver through its door (cuda_driver.py), the only one.
    ("tuner.runtime.shipped",),
    ("tuner.profiles",),
    ("tuner.kernels",),
    ("tuner.runtime",),
    ("tuner.store",),
    ("tuner.backends",),
    ("tuner.search",),
    ("tuner.export",),
    ("tuner.reporting",),
    ("tuner.cli", "tuner.__main__", "tuner.early_start"),
)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
TEMPLATES = PACKAGE.parent / "kernel_templates"
MAX_CUDA_FUNCTION_LINES = 150  # issue 39: the sm_80 forward was one 322-line function


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The tuner modules that `name` imports (a `from pkg import mod` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules (first == last), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_cycle_finder_finds_a_hidden_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_tuner_modules() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def layer_of(module: str) -> int:
    """Index in LAYERS of the most specific entry naming `module` or a package above it."""
    best, best_len = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def test_every_module_has_a_layer() -> None:
    assert [m for m in import_graph() if layer_of(m) < 0] == []


def test_imports_only_point_down_the_layers() -> None:
    upward = [f"{m} -> {d}" for m, deps in import_graph().items() for d in deps if layer_of(d) > layer_of(m)]
    assert not upward, "imports that point up the layers: " + ", ".join(sorted(upward))


def test_the_shipped_runtime_imports_nothing_from_tuner() -> None:
    """Exports copy this folder whole: its modules import each other relatively, never `tuner`."""
    shipped = sorted((PACKAGE / "runtime" / "shipped").glob("*.py"))
    assert len(shipped) >= 9
    for path in shipped:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not any(n == "tuner" or n.startswith("tuner.") for n in names), f"{path.name} imports {names}"


def test_one_module_opens_the_cuda_driver() -> None:
    """libcuda is opened and its results checked in the shipped runtime's door alone (the exports, the
    tuner's launches and its device query share it); PyCUDA, in runtime/driver.py, only binds the GPU
    worker's context."""
    loader = re.compile(r"\b(CDLL|PyDLL|WinDLL|LoadLibrary|find_library)\s*\(")
    openers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if loader.search(text := p.read_text()) and re.search(r"libcuda|find_library\(\s*['\"]cuda", text))
    assert openers == ["runtime/shipped/cuda_driver.py"]
    pycuda = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                    if re.search(r"^\s*(import|from)\s+pycuda", p.read_text(), re.M))
    assert pycuda == ["runtime/driver.py"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} has more than {MAX_MODULE_LINES} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


_CUDA_FUNCTION = re.compile(r"^\s*(?:static\s+)?(?:__host__\s+)?(?:__device__|__global__)\b")
_NO_CODE = re.compile(r'//.*|"(?:\\.|[^"\\])*"')  # comments and string literals: their braces do not count


def cuda_function_lengths(text: str) -> dict[str, int]:
    """Lines of each CUDA function defined in `text` (by its first line), from its signature's first line to the
    brace that closes its body; declarations (no body) are not counted."""
    lines, out = text.splitlines(), {}
    for i, line in enumerate(lines):
        if not _CUDA_FUNCTION.match(line):
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            code = _NO_CODE.sub("", lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                out[f"{i + 1}: {line.strip()[:70]}"] = j - i + 1
                break
    return out


def test_cuda_function_lengths_are_measured() -> None:
    text = "__device__ int f(int a);\n__device__ void g() {\n  if (x) {\n  }\n  s = \"}\";  // }\n}\n"
    assert list(cuda_function_lengths(text).values()) == [5]


@pytest.mark.parametrize("path", sorted([*TEMPLATES.rglob("*.cu"), *TEMPLATES.rglob("*.h")]),
                         ids=lambda p: str(p.relative_to(TEMPLATES)))
def test_cuda_functions_stay_small(path: Path) -> None:
    long = [f"{where} ({n} lines)" for where, n in cuda_function_lengths(path.read_text()).items()
            if n > MAX_CUDA_FUNCTION_LINES]
    assert not long, f"CUDA functions over {MAX_CUDA_FUNCTION_LINES} lines: {', '.join(long)}"
