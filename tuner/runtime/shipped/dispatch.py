"""Dispatch table of an exported kernel package: problem key -> tuned kernel (pure Python).

Part of the runtime every export ships (this folder, copied whole); imports
nothing but the standard library. A problem is keyed on what the compiled
kernel depends on (dtype, head dim, causal, and its mask: sliding window and
logit softcap, which must match exactly) plus what makes a different
variant faster (GQA group, log2 buckets of Sq and Sk, and of batch x heads:
the work size decides how many waves of tiles fill the card, so a small grid
wants other tiles than a large one). Between tuned shapes the nearest bucket
wins: kernels handle any shape, only their speed was measured at the tuned ones.
The K/V layout (page size, 0 dense) and whether the call has per-row key
lengths (seq_lens; a paged call always has them) rank too, never exclude: any
decode kernel reads any page size and lengths, at the speed of the tiles it was
tuned with. Packed sequences (FlashAttention's varlen form: [total, H, D] tensors with cumulative lengths)
are a kernel's entry parameters, compiled in: a packed call runs only packed entries, a dense call never does
(their Sq and Sk buckets are the longest sequence's, their batch the number of sequences).
A package checked on its GPU (`tuner export --check`) also holds measured
cells: for those keys the kernel that measured fastest runs, or SDPA where
every kernel lost to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional


def seq_bucket(n: int) -> int:
    """ceil(log2 n): bucket b holds lengths (2**(b-1), 2**b]; 1 -> 0, 2048 -> 11, 2049 -> 12."""
    return (n - 1).bit_length()


def bucket_range(b: int) -> str:
    return "1" if b == 0 else f"{2 ** (b - 1) + 1}-{2 ** b}"


NO_MASK = (-1, -1, 0.0)  # (window_left, window_right, softcap): no window (-1 unbounded), no softcap (0)


def page_text(page_size: int) -> str:
    """A K/V layout in words: "a dense K/V cache", "pages of 16 rows"."""
    return f"pages of {page_size} rows" if page_size else "a dense K/V cache"


DENSE_PAGE_LOG2 = 9  # a dense cache as a page size: one log2 step past the largest page (256 rows)


def page_steps(a: int, b: int) -> int:
    """log2 steps between two page sizes (0: dense). A kernel meets contiguous runs of `page` keys; runs longer
    than its K/V tile (at most 256 keys) read like dense memory, so dense counts as one step past 256."""
    return abs((a.bit_length() - 1 if a else DENSE_PAGE_LOG2) - (b.bit_length() - 1 if b else DENSE_PAGE_LOG2))


def mask_text(mask: tuple) -> str:
    """A kernel's compiled-in mask in words: "no window, no softcap", "window (4095, -1), softcap 50"."""
    left, right, softcap = mask
    window = f"window ({left}, {right})" if left >= 0 or right >= 0 else "no window"
    return f"{window}, {f'softcap {softcap:g}' if softcap else 'no softcap'}"


@dataclass(frozen=True)
class Key:
    dtype: str
    head_dim: int
    causal: bool
    group: int  # query heads per K/V head (1: MHA)
    sq_bucket: int
    sk_bucket: int
    bh_bucket: int = 0  # seq_bucket(batch x query heads)
    # The kernel's compiled-in mask (the tuned problem's): FlashAttention's window_size (-1 unbounded; causal
    # spells its right bound -1) and the logit softcap (0 off). Absent from manifests before them: no mask.
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    # How the call's K/V lie, which no kernel compiles in (they rank, never exclude): the rows of a K/V page
    # (0: a dense cache) and whether batch rows carry their own key lengths (seq_lens: a ragged batch; a paged
    # call always does). Absent from manifests before them: dense, no lengths.
    page_size: int = 0
    seq_lens: bool = False
    # Packed sequences ([total, H, D] with cu_seqlens): compiled into a kernel's parameters, so it must match.
    # Absent from manifests before them: dense.
    packed: bool = False

    def __post_init__(self) -> None:
        if self.window_right == 0:  # a right bound of 0 is causality: one spelling (causal, -1), as Problem's
            object.__setattr__(self, "causal", True)
            object.__setattr__(self, "window_right", -1)
        object.__setattr__(self, "softcap", float(self.softcap))
        object.__setattr__(self, "seq_lens", bool(self.seq_lens or self.page_size))  # pages come with lengths
        object.__setattr__(self, "packed", bool(self.packed))

    @classmethod
    def of(cls, dtype: str, head_dim: int, causal: bool, heads: int, heads_kv: int, sq: int, sk: int,
           batch: int = 1, mask: tuple = NO_MASK, page_size: int = 0, seq_lens: bool = False,
           packed: bool = False) -> "Key":
        """The key of a call; `mask` is its (window_left, window_right, softcap), `page_size` its K/V page's rows
        (0: dense), `seq_lens` whether it passes per-row key lengths and `packed` whether its sequences lie packed
        (sq and sk then the longest sequence's, batch the number of sequences)."""
        return cls(dtype, head_dim, bool(causal), heads // heads_kv, seq_bucket(sq), seq_bucket(sk),
                   seq_bucket(max(batch * heads, 1)), int(mask[0]), int(mask[1]), float(mask[2]), int(page_size),
                   bool(seq_lens), bool(packed))

    @property
    def features(self) -> tuple[str, int, bool]:
        """The dtype, head dim and causality compiled into a kernel (with `mask`: what must match exactly)."""
        return (self.dtype, self.head_dim, self.causal)

    @property
    def mask(self) -> tuple[int, int, float]:
        """The window and softcap compiled into a kernel: (window_left, window_right, softcap)."""
        return (self.window_left, self.window_right, self.softcap)

    @property
    def compiled(self) -> tuple:
        """Everything compiled into a kernel: a key runs only kernels whose `compiled` is its own (dtype, head dim,
        causal, window left and right, softcap, packed)."""
        return self.features + self.mask + (self.packed,)

    @property
    def layout(self) -> tuple[int, bool]:
        """How the call's K/V lie: (page_size, seq_lens); they rank entries, nothing is compiled for them."""
        return (self.page_size, self.seq_lens)

    def label(self) -> str:
        causal = "causal" if self.causal else "non-causal"
        mask = f" {mask_text(self.mask)}," if self.mask != NO_MASK else ""
        return (f"{self.dtype} D{self.head_dim} {causal}{mask} group {self.group}, Sq bucket {self.sq_bucket} "
                f"({bucket_range(self.sq_bucket)}), Sk bucket {self.sk_bucket} ({bucket_range(self.sk_bucket)}), "
                f"batch x heads bucket {self.bh_bucket} ({bucket_range(self.bh_bucket)}){layout_text(self)}")


def layout_text(key: Key) -> str:
    """", in pages of 16 rows, with per-row key lengths" (empty for a dense call without lengths)."""
    pages = f", in {page_text(key.page_size)}" if key.page_size else ""
    packed = ", packed sequences (varlen)" if key.packed else ""
    return pages + (", with per-row key lengths" if key.seq_lens else "") + packed


@dataclass(frozen=True)
class Choice:
    entry: Mapping[str, Any]  # the manifest entry (kernel, trial_id, problem_label, median_us, ...)
    key: Key  # the asked key
    tuned: Key  # the entry's key
    exact: bool  # the Sq and Sk buckets and the group were tuned
    distance: int  # |d log2 Sq| + |d log2 Sk| between the buckets
    candidates: int  # tuned entries with the same dtype, head dim and causality
    cell: Optional[Mapping[str, Any]] = None  # the measured cell of `tuner export --check` for this key

    @property
    def route(self) -> Optional[str]:
        """'sdpa' when calls of this key run torch SDPA: a measured cell decides, else the entry's own figure."""
        if self.cell is not None:
            return "sdpa" if self.cell.get("route") == "sdpa" else None
        return self.entry.get("route")

    @property
    def reason(self) -> str:
        if self.cell is not None:
            return "this key was measured by `tuner export --check`: the fastest verified choice there runs"
        work = ""
        if self.tuned.bh_bucket != self.key.bh_bucket:
            work = (f"; tuned for batch x heads in bucket {self.tuned.bh_bucket} ({bucket_range(self.tuned.bh_bucket)}), "
                    f"nearest to {self.key.bh_bucket} among those")
        work += layout_note(self.tuned, self.key)
        if self.exact:
            return "exact match: this bucket was tuned" + work
        parts = []
        if self.distance:
            parts.append(f"nearest tuned bucket (Sq bucket {self.tuned.sq_bucket}, Sk bucket {self.tuned.sk_bucket}) "
                         f"at log2 distance {self.distance}")
        if self.tuned.group != self.key.group:
            parts.append(f"tuned for GQA group {self.tuned.group}, not {self.key.group} (the kernel takes any group)")
        mask = f" ({mask_text(self.key.mask)})" if self.key.mask != NO_MASK else ""
        return "; ".join(parts) + work + f"; chosen among {self.candidates} tuned entries for " \
                                  f"{self.key.dtype} D{self.key.head_dim} {'causal' if self.key.causal else 'non-causal'}{mask}"


def layout_note(tuned: Key, key: Key) -> str:
    """Where a tuned entry's K/V layout differs from the call's, in words ("" where it does not)."""
    note = ""
    if tuned.page_size != key.page_size:
        note += (f"; tuned on {page_text(tuned.page_size)}, not {page_text(key.page_size)} (a decode kernel reads any "
                 f"page size, at the speed of its tuned tiles: the nearest page size is preferred)")
    if tuned.seq_lens != key.seq_lens:
        note += (f"; tuned {'with' if tuned.seq_lens else 'without'} per-row key lengths, and this call has "
                 f"{'them' if key.seq_lens else 'none'}")
    return note


def cell_summary(cell: Mapping[str, Any]) -> str:
    """One line on a measured cell: what ran fastest there against the best SDPA backend."""
    ratio, base = cell.get("ratio"), cell.get("sdpa_impl") or "SDPA"
    where = f"at {cell.get('problem_label', '?')}"
    kernel = f"{cell['kernel']} {ratio:.2f}x {base}" if cell.get("kernel") and ratio else "no kernel verified"
    if cell.get("route") == "sdpa":
        return f"routed to SDPA {where} (best kernel: {kernel})"
    return f"{kernel} {where}"


def entry_key(entry: Mapping[str, Any]) -> Key:
    """The key of a manifest entry or measured cell (a manifest from before windows and softcaps: no mask; from
    before page sizes and lengths: dense, no lengths; from before packed sequences: not packed)."""
    k = entry["key"]
    return Key(k["dtype"], int(k["head_dim"]), bool(k["causal"]), int(k["group"]), int(k["sq_bucket"]), int(k["sk_bucket"]),
               int(k.get("bh_bucket", 0)), int(k.get("window_left", -1)), int(k.get("window_right", -1)),
               float(k.get("softcap", 0.0)), int(k.get("page_size", 0)), bool(k.get("seq_lens", False)),
               bool(k.get("packed", False)))


class DispatchTable:
    """The tuned entries of one package, with nearest-bucket choice."""

    def __init__(self, entries: list[Mapping[str, Any]], cells: list[Mapping[str, Any]] = ()) -> None:
        self.entries = [e for e in entries if e.get("dispatch", True)]
        self._by_trial = {e["trial_id"]: e for e in entries}  # a measured cell may pick a shadowed entry
        self.cells = {entry_key(c): c for c in cells if c.get("trial_id") in self._by_trial}
        # Key.compiled (dtype, head dim, causal, window left and right, softcap, packed) -> its entries
        self._by_compiled: dict[tuple, list[tuple[Key, Mapping[str, Any]]]] = {}
        for e in self.entries:
            key = entry_key(e)
            self._by_compiled.setdefault(key.compiled, []).append((key, e))

    def supported(self) -> list[tuple]:
        """Every compiled combination the package has: (dtype, head dim, causal, window left, right, softcap,
        packed)."""
        return sorted(self._by_compiled)

    def head_dims(self, dtype: str, causal: bool, packed: bool = False) -> list[int]:
        return sorted({c[1] for c in self._by_compiled if c[0] == dtype and c[2] == causal and c[6] == packed})

    def choose(self, key: Key) -> Optional[Choice]:
        """The entry for `key`, or None when no kernel has its dtype, head dim, causality and mask (and query length)."""
        ranked = self.ranked(key)
        if not ranked:
            return None
        cell = self.cells.get(key)
        if cell is None and key.sq_bucket == 0:  # one query: the other causality's measured cell holds too
            cell = self.cells.get(_other_causality(key))
        tk, e = (entry_key(self._by_trial[cell["trial_id"]]), self._by_trial[cell["trial_id"]]) if cell else ranked[0]
        dist = abs(tk.sq_bucket - key.sq_bucket) + abs(tk.sk_bucket - key.sk_bucket)
        exact = (tk.group, tk.sq_bucket, tk.sk_bucket) == (key.group, key.sq_bucket, key.sk_bucket)
        return Choice(e, key, tk, exact, dist, len(ranked), cell)

    def ranked(self, key: Key) -> list[tuple[Key, Mapping[str, Any]]]:
        """The tuned entries that can run `key` (same dtype, head dim, causality and mask), the rule's choice first:
        the nearest in buckets and page size, causality, group, work size, then lengths kind.

        One query is the same computation causal or not (bottom-right, it sees every key up to its own; a right
        window bound adds none), so a one-query key also takes the other causality's entries of its left
        window and softcap, ranked after its own at the same distance."""
        wanted = [key.compiled] + ([_other_causality(key).compiled] if key.sq_bucket == 0 else [])
        # An entry of a short-query (decode) kernel takes only queries up to its max_seq_q.
        cands = [(tk, e) for c in wanted for tk, e in self._by_compiled.get(c, ())
                 if not e.get("max_seq_q") or key.sq_bucket <= seq_bucket(int(e["max_seq_q"]))]
        if not cands:
            return []

        def rank(item: tuple[Key, Mapping[str, Any]]) -> tuple:
            tk, e = item
            # A log2 step of page size counts as one of Sq or Sk (page_steps: dense is one past 256). A kernel tuned
            # on a dense cache ran 16-row pages at 0.71x its dense time (a ragged decode batch, H32 Hkv8 D128 bf16,
            # up to 9000 keys) where a page-16-tuned one is within 2% of dense: about 7% for each of those 5 steps;
            # an Sk bucket off the tuned one costs more or less than that by shape, so they weigh alike. Neither
            # goes first outright: the page size first would send a dense decode step to a prefill kernel (one
            # query in 128-row tiles) where only paged decode kernels were tuned; the buckets first, a page-16 call
            # to a dense-tuned kernel one Sk bucket nearer.
            dist = (abs(tk.sq_bucket - key.sq_bucket) + abs(tk.sk_bucket - key.sk_bucket)
                    + page_steps(tk.page_size, key.page_size))
            group_dist = abs(math.log2(tk.group) - math.log2(max(key.group, 1)))
            # Then the nearest work size; then the call's lengths kind (a kernel tuned on a ragged batch and one
            # tuned at full lengths differ by 1-2% on either: less than a group or a wave of tiles); ties: prefer
            # the larger bucket (long sequences are where tuning pays), then the older trial.
            return (dist, tk.causal != key.causal, group_dist, abs(tk.bh_bucket - key.bh_bucket),
                    tk.seq_lens != key.seq_lens, -tk.sq_bucket, -tk.sk_bucket, e.get("trial_id", 0))

        return sorted(cands, key=rank)

    def unsupported_reason(self, key: Key) -> str:
        """Why no kernel fits `key` (names the limit), for errors and explain()."""
        form = [c for c in self._by_compiled if c[6] == key.packed]  # packed calls run only packed kernels
        if not form and self._by_compiled:
            return (f"{'packed sequences (varlen) are' if key.packed else 'dense calls are'} not supported by this "
                    f"package: its kernels take only {'dense' if key.packed else 'packed'} calls "
                    f"(tuned: {self.describe()})")
        dts = sorted({c[0] for c in form})
        packed = "packed " if key.packed else ""
        if key.dtype not in dts:
            return f"dtype {key.dtype} is not supported: this package has {packed}kernels for {', '.join(dts)}"
        causal = "causal" if key.causal else "non-causal"
        dims = self.head_dims(key.dtype, key.causal, key.packed)
        if not dims:
            return f"{packed}{causal} attention in {key.dtype} is not supported by this package (tuned: {self.describe()})"
        if key.head_dim not in dims:
            return f"head dim {key.head_dim} is not supported for {packed}{causal} {key.dtype}: tuned head dims are {dims}"
        masks = sorted({c[3:6] for c in form if c[:3] == key.features})
        if key.compiled not in self._by_compiled:
            return (f"{mask_text(key.mask)} is not supported for {packed}{causal} {key.dtype} D{key.head_dim}: its kernels here "
                    f"have {' / '.join(mask_text(m) for m in masks)} (a window and a softcap are compiled in)")
        longest = max(int(e.get("max_seq_q") or 0) for _, e in self._by_compiled[key.compiled])
        return (f"queries of more than {longest} rows are not supported for {causal} {key.dtype} D{key.head_dim}: "
                f"this package has only short-query (decode) kernels for it")

    def describe(self) -> str:
        return ", ".join(f"{c[0]} D{c[1]}{' causal' if c[2] else ''}"
                         + ("" if c[3:6] == NO_MASK else f" ({mask_text(c[3:6])})") + (" packed" if c[6] else "")
                         for c in self.supported())


def _other_causality(key: Key) -> Key:
    """A one-query key's twin of the other causality: the same left window and softcap, no right bound."""
    return replace(key, causal=not key.causal, window_right=-1)


@dataclass(frozen=True)
class Explanation:
    """What attention() would do with these inputs, and why (str() gives the text)."""

    kernel: Optional[str]
    trial_id: Optional[int]
    exact: bool
    reason: str
    code: str  # where the machine code comes from: a cubin, a JIT compile, or nothing
    error: Optional[str]  # the error attention() would raise (without fallback), if any
    text: str

    def __str__(self) -> str:
        return self.text
