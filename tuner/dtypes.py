"""The dtype registry: every fact about a problem's dtype, stated once (issue 39, item 1).

A problem's dtype is a name (Problem.dtype, a store column, an export key). What the name means (the types of
q, k, v and the output, their torch and C++ spellings, the verification tolerance, the header export's code)
is read from here by every layer: problem, verify, render, profiles, export. Adding a dtype means a spec here
and the kernels that take it.

The shipped runtime may import nothing from `tuner` (exports copy it whole), so it keeps a generated copy,
tuner/runtime/shipped/dtypes.py: `python -m tuner.dtypes` writes it, tests/test_dtypes.py fails when it
differs from shipped_source().
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from tuner.errors import TunerError


@dataclass(frozen=True)
class Element:
    """One storage type of q, k, v or the output."""

    name: str  # the dtype of a problem whose q, k, v and output are all of this type
    torch: str  # torch's attribute: torch.float16
    cxx: str  # the C++ type (cuda_fp16.h ...; the tuner's compiles declare it in kernel_templates/common/cuda_types.h)
    bytes: int
    tensor_map: int  # the CUtensorMapDataType of a TMA map over it: FLOAT16 6, BFLOAT16 9, UINT8 0 (e4m3 as bytes)
    peak: str  # the GpuProfile field with its dense tensor-core peak


FP16 = Element("fp16", "float16", "half", 2, 6, "peak_fp16_tflops")
BF16 = Element("bf16", "bfloat16", "__nv_bfloat16", 2, 9, "peak_bf16_tflops")
E4M3 = Element("e4m3", "float8_e4m3fn", "__nv_fp8_e4m3", 1, 0, "peak_fp8_tflops")
ELEMENTS: Mapping[str, Element] = MappingProxyType({e.name: e for e in (FP16, BF16, E4M3)})
KV_E4M3 = "_kv_e4m3"  # the suffix of an FP8 KV cache's dtype (a model's dtype + this: tuner.models)


@dataclass(frozen=True)
class DtypeSpec:
    """A problem dtype: what its q, k, v and output are, and how each layer spells it."""

    name: str
    code: int  # its number in a header export's nearest_bucket(): published in exported headers, never renumbered
    query: Element  # q
    kv: Element  # k and v (Problem.elem_bytes: what a decode step streams)
    output: Element
    compute: Element  # the MMA operand type whose peak bounds the kernel (GpuProfile.peak_tflops)
    baseline: Element  # what the 16-bit baselines (SDPA, FA4) run in: FP8 inputs are dequantised to it
    template_arg: str  # the templates' `dtype` argument (the render's and a header export's spelling)
    tolerance: float  # relative L2 error allowed against the fp32 reference (README, "How a trial runs")

    @property
    def fp8(self) -> bool:
        """Whether any input is FP8: the inputs come with scales."""
        return E4M3 in (self.query, self.kv)

    @property
    def fp8_kv(self) -> bool:
        """Whether only k and v are FP8 (an FP8 KV cache under 16-bit queries)."""
        return self.kv == E4M3 and self.query != E4M3


def _plain(element: Element, code: int, tolerance: float, output: Element | None = None) -> DtypeSpec:
    """q, k and v all of `element`; the output too unless given."""
    out = output or element
    return DtypeSpec(element.name, code, element, element, out, element, out, element.cxx, tolerance)


def _fp8_kv_cache(over: DtypeSpec, code: int) -> DtypeSpec:
    """An FP8 KV cache (vLLM's k_scale / v_scale) under `over`'s 16-bit q and output. k and v widen to fp16
    exactly and the kernels compute in fp16 (attn_decode/kv_fp8.h); the reference sees their real values, so
    only the kernel's 16-bit rounding is left (P in fp16, Q as fp16 times a power of two: no coarser than the
    query dtype's): the query dtype's tolerance. The template argument is a tag over q's type
    (attn_decode/config.h)."""
    return DtypeSpec(over.name + KV_E4M3, code, over.query, E4M3, over.output, FP16, over.query,
                     f"fc::KvE4m3<{over.query.cxx}>", over.tolerance)


# Tolerances. e4m3 (q, k, v FP8 with descales, bf16 out): the reference runs on the exact dequantised inputs, so the
# kernel's own rounding is what shows, and most of it is P: the kernel quantises the softmax probabilities to
# e4m3 before P.V. Three mantissa bits round each p by up to 2^-4 of itself, about 0.03 rms (relative); the
# output is a p-weighted mean of the rows of V, so its relative L2 error is about that rms again (the largest p
# is exact, so a peaked row errs less). The bf16 output adds ~2^-9, the fp8 MMAs' accumulation less.
# Probabilities below e4m3's smallest normal round coarser: FlashAttention-3 scales P by 2^8 before converting
# (softmax.h, Max_offset = 8) so that they stay normal. Simulated on a CPU (tests/test_fp8_inputs.py):
# 0.017-0.027 with that offset from Sk 256 to 128K; without it 0.02 at Sk 256 rising to 0.039 at 128K, close to
# the limit. 5e-2 leaves ~1.8x room over the offset kernel; a wrong descale is off by 0.4 or more.
_FP16, _BF16 = _plain(FP16, 0, 2e-3), _plain(BF16, 1, 1e-2)
_SPECS = (_FP16, _BF16, _plain(E4M3, 2, 5e-2, output=BF16), _fp8_kv_cache(_FP16, 3), _fp8_kv_cache(_BF16, 4))
SPECS: Mapping[str, DtypeSpec] = MappingProxyType({s.name: s for s in _SPECS})


def spec(name: str) -> DtypeSpec:
    """The spec of dtype `name`."""
    try:
        return SPECS[name]
    except KeyError:
        raise TunerError(f"unknown dtype {name!r}; expected one of {', '.join(SPECS)}") from None


def names_text() -> str:
    """Every dtype's name for a user to read: "fp16, bf16, ... or bf16_kv_e4m3" (the CLI's help)."""
    names = list(SPECS)
    return f"{', '.join(names[:-1])} or {names[-1]}"


SHIPPED_COPY = Path(__file__).resolve().parent / "runtime" / "shipped" / "dtypes.py"


def shipped_source() -> str:
    """The text of the shipped runtime's copy: the same facts as plain dicts (elements by name)."""
    elements = "".join(f"    {e.name!r}: {asdict(e)!r},\n" for e in ELEMENTS.values())
    named = {s.name: dict(asdict(s), query=s.query.name, kv=s.kv.name, output=s.output.name, compute=s.compute.name,
                          baseline=s.baseline.name) for s in SPECS.values()}
    specs = "".join(f"    {name!r}: {fields!r},\n" for name, fields in named.items())
    return ('"""The dtype registry (tuner/dtypes.py) as the shipped runtime reads it: exports import nothing from\n'
            "tuner. GENERATED by `python -m tuner.dtypes`; do not edit (tests/test_dtypes.py compares the two).\n"
            '"""\n\n'
            f"ELEMENTS = {{\n{elements}}}\n"
            f"DTYPES = {{\n{specs}}}\n")


def write_shipped_copy(path: Path = SHIPPED_COPY) -> bool:
    """Write the shipped copy; whether it changed."""
    text = shipped_source()
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


if __name__ == "__main__":
    print(f"{SHIPPED_COPY}: {'written' if write_shipped_copy() else 'up to date'}", file=sys.stderr)
