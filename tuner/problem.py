"""The attention problem a kernel is tuned for, and its parsing from the CLI."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any, Mapping

from tuner.dtypes import KV_E4M3, SPECS, spec  # noqa: F401 (KV_E4M3: this module's API too)
from tuner.errors import TunerError

# A problem's dtype names its spec in the dtype registry (tuner.dtypes): what q, k, v and the output are. e4m3 is
# FP8 q, k and v with float32 descale factors per batch row and K/V head (FlashAttention-3's q_descale, k_descale,
# v_descale [B, Hkv]: real value = fp8 value * descale) and a bf16 output. fp16_kv_e4m3 and bf16_kv_e4m3 are an
# FP8 KV cache: q and the output 16-bit, k and v float8_e4m3fn with float32 scales per batch row and K/V head
# (vLLM's k_scale / v_scale, broadcast to [B, Hkv]: real value = fp8 value * scale).
DTYPES = tuple(SPECS)
DTYPE_BYTES = {name: s.kv.bytes for name, s in SPECS.items()}  # bytes of one k or v element


def query_dtype(dtype: str) -> str:
    """The dtype of q (and of the output, but for e4m3's bf16): fp16, bf16 or e4m3."""
    return spec(dtype).query.name


def kv_dtype(dtype: str) -> str:
    """The dtype of k and v: fp16, bf16 or e4m3."""
    return spec(dtype).kv.name


def dtype_pattern() -> str:
    """A regex alternation of DTYPES, longest first (bf16_kv_e4m3 before bf16) so a match takes the whole dtype."""
    return "|".join(sorted(DTYPES, key=len, reverse=True))
MAX_EXTENT = 2**31 - 1  # a batch, head count or length beyond this fits no CUDA grid (nor a 32-bit index)
PAGE_SIZES = (16, 32, 64, 128, 256)
# bhsd / bshd: dense K/V in that order; pagedN: K/V in a paged cache of N-row pages ([pages, N, Hkv, D], vLLM's
# layout, the pages in shuffled order; decode templates only), Q and O BHSD. packed: a batch of sequences one
# after another in [total, H, D] tensors with cumulative lengths (FlashAttention's varlen form, a serving
# engine's many-prompt prefill): sequence b has key_lengths()[b] queries and as many keys, Sq = Sk is the longest
# a sequence may be; the Hopper prefill template.
PACKED = "packed"
LAYOUTS = ("bhsd", "bshd", PACKED) + tuple(f"paged{n}" for n in PAGE_SIZES)
# How many keys each batch row uses: "full" (all Sk) or "uniform:LO" (each row's length drawn uniformly from
# LO .. Sk, a serving batch of sequences at different points; decode templates, and packed sequences' lengths). The draw is seeded by
# the problem, so every trial, baseline and later re-timing sees the same batch.
FULL_LENGTHS = "full"
LENGTHS_SEED = 20261126
# Which pass of attention a problem tunes: the forward (O from q, k, v) or the backward (dQ, dK, dV from q, k, v,
# the forward's O and lse, and dO). Another pass is another problem: its own study, store row and baselines.
FORWARD, BACKWARD = "forward", "backward"
PASSES = (FORWARD, BACKWARD)
BACKWARD_FLOPS = 2.5  # the backward's matmul work over the forward's, as FlashAttention's benchmarks count it


@dataclass(frozen=True, order=True)
class Problem:
    """Q [B, H, Sq, D]; K and V [B, Hkv, Sk, D] (layout says how they lie in memory)."""

    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    heads_kv: int = 0  # 0 means "same as heads" and is normalised away in __post_init__
    layout: str = "bhsd"
    lengths: str = FULL_LENGTHS
    # Local (sliding-window) attention, FlashAttention's window_size: query i (aligned to the keys' end,
    # i' = i + Sk - Sq) sees key j iff i' - window_left <= j <= i' + window_right; -1 is unbounded. With
    # causal the right bound is 0 already, and window_right is kept at -1.
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0  # logit softcapping (Gemma-2): scores become softcap * tanh(scores / softcap); 0 is off
    kernel_pass: str = FORWARD  # PASSES: forward, or backward (dQ, dK, dV); stored in the problems' `pass` column

    def __post_init__(self) -> None:
        if self.heads_kv == 0:
            object.__setattr__(self, "heads_kv", self.heads)
        if self.window_right == 0:  # a right bound of 0 is causality (FlashAttention folds it the same way):
            object.__setattr__(self, "causal", True)  # one spelling, causal with -1
            object.__setattr__(self, "window_right", -1)
        check_window(self.window_left, self.window_right, self.causal)
        object.__setattr__(self, "softcap", check_softcap(self.softcap))
        for field_name in ("batch", "heads", "seq_q", "seq_k", "head_dim", "heads_kv"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise TunerError(f"problem {field_name} must be a positive integer, got {value!r}")
        if self.heads % self.heads_kv:
            raise TunerError(f"heads ({self.heads}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.dtype not in DTYPES:
            raise TunerError(f"unsupported dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise TunerError(f"unsupported layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        parse_lengths(self.lengths, self.seq_k)
        if self.kernel_pass not in PASSES:
            raise TunerError(f"unsupported pass {self.kernel_pass!r}; expected one of {', '.join(PASSES)}")
        if self.packed and (self.seq_q != self.seq_k or self.fp8):
            raise TunerError("packed sequences are a prefill of 16-bit inputs: each sequence's queries are its keys "
                             f"(Sq = Sk, got Sq {self.seq_q} Sk {self.seq_k}; dtype {self.dtype})")

    @property
    def local(self) -> bool:
        """Whether a sliding window bounds the keys a query sees (beyond causality)."""
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def packed(self) -> bool:
        """Whether the sequences lie packed in [total, H, D] tensors (layout "packed"), each key_lengths()[b] long."""
        return self.layout == PACKED

    @property
    def ragged(self) -> bool:
        """Whether the batch rows use different numbers of keys (a length distribution other than full)."""
        return self.lengths != FULL_LENGTHS

    @property
    def backward(self) -> bool:
        """Whether the problem is attention's backward pass (dQ, dK, dV), not its forward."""
        return self.kernel_pass == BACKWARD

    def key_lengths(self) -> tuple[int, ...]:
        """The keys each batch row uses: Sk each when full, else the problem's seeded draw."""
        low = parse_lengths(self.lengths, self.seq_k)
        if low is None:
            return (self.seq_k,) * self.batch
        rng = random.Random(LENGTHS_SEED + self.batch * 7919 + self.seq_k)
        return tuple(rng.randint(low, self.seq_k) for _ in range(self.batch))

    @property
    def elem_bytes(self) -> int:
        """Bytes of one k or v element (1 for e4m3 and an FP8 KV cache; 2 else): what a decode step streams."""
        return DTYPE_BYTES[self.dtype]

    @property
    def fp8(self) -> bool:
        """Whether any input is FP8 (e4m3 q, k, v, or an FP8 KV cache): inputs come with scales (fp8_inputs)."""
        return spec(self.dtype).fp8

    @property
    def fp8_kv(self) -> bool:
        """Whether only k and v are FP8 (an FP8 KV cache with 16-bit queries)."""
        return spec(self.dtype).fp8_kv

    @property
    def page_size(self) -> int:
        """Rows of a K/V page (0: a dense layout)."""
        return int(self.layout[5:]) if self.layout.startswith("paged") else 0

    def to_dict(self) -> dict[str, Any]:
        """Every field by name: the one serialised form (store rows, study attributes, exports, JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Problem":
        """Inverse of to_dict; unknown or missing fields are a TunerError naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise TunerError(f"unknown problem field(s) {', '.join(unknown)}; expected {', '.join(sorted(names))}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise TunerError(f"incomplete problem {dict(data)!r}: {exc}") from None

    @property
    def flops(self) -> float:
        """4*B*H*Sq*Sk*D, as FlashAttention's benchmarks count; causal with Sq = Sk counts half of it, and
        causal with Sq != Sk counts the (query, key) pairs the bottom-right aligned mask keeps. A ragged
        batch counts each row's own keys. The backward counts BACKWARD_FLOPS times the forward's."""
        per_pair = 4.0 * self.heads * self.head_dim * (BACKWARD_FLOPS if self.backward else 1.0)
        if self.ragged:
            return per_pair * sum(self._pairs(n) for n in self.key_lengths())
        return per_pair * self.batch * self._pairs(self.seq_k)

    def _pairs(self, seq_k: int) -> float:
        seq_q = seq_k if self.packed else self.seq_q  # a packed sequence's queries are its keys
        if self.local:
            right = 0 if self.causal else self.window_right
            return window_pairs(seq_q, seq_k, self.window_left, right)
        if not self.causal:
            return seq_q * seq_k
        if seq_q == seq_k:
            return seq_q * seq_k / 2
        return causal_pairs(seq_q, seq_k)

    def tflops(self, microseconds: float) -> float:
        return self.flops / (microseconds * 1e-6) / 1e12

    @property
    def kv_bytes(self) -> int:
        """What a call must read of K and V at least: each batch row's keys once (those its queries see through a
        left window), in the K/V dtype: a decode step's time is these bytes over the memory bandwidth."""
        def seen(n: int) -> int:
            return n if self.window_left < 0 else min(n, self.window_left + self.seq_q)

        return 2 * sum(seen(n) for n in self.key_lengths()) * self.heads_kv * self.head_dim * self.elem_bytes

    def kv_gbs(self, microseconds: float) -> float:
        """kv_bytes per second, in GB/s (a decode kernel's figure of merit)."""
        return self.kv_bytes / (microseconds * 1e3)

    @property
    def label(self) -> str:
        seq = f"S{self.seq_q}" if self.seq_q == self.seq_k else f"Sq{self.seq_q} Sk{self.seq_k}"
        gqa = f" Hkv{self.heads_kv}" if self.heads_kv != self.heads else ""
        causal = " causal" if self.causal else ""
        paged = f" paged{self.page_size}" if self.page_size else " packed" if self.packed else ""
        lengths = f" lengths {self.lengths}" if self.ragged else ""
        window = f" window {window_text(self.window_left, self.window_right, self.causal)}" if self.local else ""
        softcap = f" softcap {self.softcap:g}" if self.softcap else ""
        kernel_pass = " backward" if self.backward else ""
        return (f"B{self.batch} H{self.heads}{gqa} {seq} D{self.head_dim} {self.dtype}{causal}{window}{softcap}"
                f"{paged}{lengths}{kernel_pass}")


def parse_lengths(text: str, seq_k: int) -> int | None:
    """The lowest length of a "uniform:LO" distribution (None for "full"); anything else is a TunerError."""
    if text == FULL_LENGTHS:
        return None
    kind, _, low = text.partition(":")
    if kind == "uniform" and low.isdigit() and 1 <= int(low) <= seq_k and str(int(low)) == low:
        return int(low)
    raise TunerError(f"unsupported key lengths {text!r}: expected 'full' or 'uniform:LO' with 1 <= LO <= Sk ({seq_k})")


def check_window(left: int, right: int, causal: bool) -> None:
    """A TunerError unless (left, right) is a window FlashAttention would take: integers >= -1 (-1 is
    unbounded), and with causal no right bound past 0."""
    for side, value in (("window_left", left), ("window_right", right)):
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value <= MAX_EXTENT:
            raise TunerError(f"{side} must be an integer from -1 (unbounded) to {MAX_EXTENT}, got {value!r}")
    if causal and right > 0:
        raise TunerError(f"a causal problem sees no key right of its query: window_right must be 0 or -1, got {right}")


def check_softcap(value: object) -> float:
    """The softcap as a float: 0 (off) or a finite positive number; anything else is a TunerError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TunerError(f"softcap must be 0 (off) or a positive finite number, got {value!r}")
    return float(value)


def window_text(left: int, right: int, causal: bool) -> str:
    """The window as --window takes it: "L" (causal, or no right bound), else "L,R" (-1 unbounded)."""
    return str(left) if causal or right < 0 else f"{left},{right}"


def parse_window(text: str) -> tuple[int, int]:
    """--window "L" or "L,R" into (left, right); "L" leaves the right side unbounded (-1)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < -1 for v in values):
        raise TunerError(f"malformed window {text!r}: expected L or L,R with integers >= -1 (-1: unbounded)")
    return (values[0], values[1] if len(values) == 2 else -1)


def window_pairs(seq_q: int, seq_k: int, left: int, right: int) -> int:
    """(query, key) pairs a window keeps (left/right -1: unbounded; causal is right = 0). Query i, aligned
    to i' = i + Sk - Sq, keeps the keys j in [i' - left, i' + right] that exist: clamp(i' + right + 1, 0, Sk)
    - clamp(i' - left, 0, Sk) of them, summed over the rows in closed form."""

    def clamped_sum(first: int) -> int:
        """Sum of clamp(x, 0, Sk) for x = first .. first + Sq - 1."""
        return _positive_sum(first, seq_q) - _positive_sum(first - seq_k, seq_q)

    offset = seq_k - seq_q
    upper = seq_q * seq_k if right < 0 else clamped_sum(offset + right + 1)
    lower = 0 if left < 0 else clamped_sum(offset - left)
    return upper - lower


def _positive_sum(first: int, count: int) -> int:
    """Sum of max(x, 0) for x = first .. first + count - 1."""
    last = first + count - 1
    if last <= 0:
        return 0
    if first >= 1:
        return (first + last) * count // 2
    return last * (last + 1) // 2


def causal_pairs(seq_q: int, seq_k: int) -> int:
    """(query, key) pairs kept by the bottom-right aligned causal mask: query i sees keys
    0 .. i + Sk - Sq, so row i keeps clamp(i + Sk - Sq + 1, 0, Sk) keys (summed in closed form)."""
    start = seq_k - seq_q + 1  # keys row 0 keeps, before clamping to [0, Sk]
    # min(max(x, 0), Sk) = max(x, 0) - max(x - Sk, 0)
    return _positive_sum(start, seq_q) - _positive_sum(start - seq_k, seq_q)


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """Parse 'B,H,S,D' or 'B,H,Sq,Sk,D' into (B, H, Sq, Sk, D)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise TunerError(f"malformed shape {text!r}: expected B,H,S,D or B,H,Sq,Sk,D with integers") from None
    if len(numbers) == 4:
        b, h, s, d = numbers
        numbers = [b, h, s, s, d]
    if len(numbers) != 5 or any(n < 1 for n in numbers):
        raise TunerError(f"malformed shape {text!r}: expected B,H,S,D or B,H,Sq,Sk,D with positive integers")
    if any(n > MAX_EXTENT for n in numbers):
        raise TunerError(f"malformed shape {text!r}: every extent must be at most {MAX_EXTENT} (a CUDA grid's limit)")
    return tuple(numbers)  # type: ignore[return-value]


def problem_from_shape(
    text: str, dtype: str = "fp16", causal: bool = False, heads_kv: int | None = None, layout: str = "bhsd",
    lengths: str = FULL_LENGTHS, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    kernel_pass: str = FORWARD,
) -> Problem:
    b, h, sq, sk, d = parse_shape(text)
    return Problem(b, h, sq, sk, d, dtype=dtype, causal=causal, heads_kv=heads_kv or h, layout=layout, lengths=lengths,
                   window_left=window[0], window_right=window[1], softcap=softcap, kernel_pass=kernel_pass)
