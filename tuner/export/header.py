"""tuner export --format header: the tuned constants as a C++ header for fc::AttnConfig<...>.

For users who compile the template into their own CUDA code: one struct
per tuned problem bucket with the constants as constexpr, the AttnConfig
instantiation (exactly the one the tuner rendered and measured), and a
lookup function over the buckets. The template source is copied next to
the header.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Optional

from tuner.dtypes import SPECS, spec
from tuner.errors import TunerError
from tuner.export.options import ExportOptions, ExportReport
from tuner.export.selection import ExportedKernel
from tuner.runtime.shipped.dispatch import DENSE_PAGE_LOG2, entry_key, seq_bucket
from tuner.export.staging import check_out, write_staged
from tuner.kernels.manifest import Manifest, load_manifest
from tuner.kernels.variant import mask_suffix
from tuner.profiles import GpuProfile

_CONFIG = re.compile(r"^using TunerCfg = (.+);$", re.M)
# Per dtype: its code in nearest_bucket() (the registry's: published in headers, never renumbered).
DTYPE_CODES = {name: s.code for name, s in SPECS.items()}


def config_of(source: str) -> str:
    """The fc::AttnConfig<...> type a rendered variant instantiates (taken from the render, not recomputed)."""
    m = _CONFIG.search(source)
    if not m:
        raise TunerError("rendered source has no TunerCfg instantiation; the template's render format changed")
    return m.group(1)


def _mask_of(key: dict[str, Any]) -> tuple[int, int, float]:
    """An entry key's compiled-in window and softcap (absent before them: none)."""
    return int(key.get("window_left", -1)), int(key.get("window_right", -1)), float(key.get("softcap", 0.0))


def _layout_of(key: dict[str, Any]) -> tuple[int, bool]:
    """An entry key's K/V page size (0 dense) and lengths kind (absent before them: dense, no lengths)."""
    return entry_key({"key": key}).layout


def _struct_name(key: dict[str, Any]) -> str:
    causal = "causal" if key["causal"] else "noncausal"
    mask = mask_suffix(*_mask_of(key))  # the variant names' spelling
    page, lens = _layout_of(key)
    layout = f"_p{page}" if page else "_lens" if lens else ""  # pages come with lengths
    layout += "_packed" if key.get("packed") else ""  # a packed kernel's bucket beside a dense one of its shape
    return (f"{key['dtype']}_d{key['head_dim']}_{causal}{mask}_g{key['group']}_sq{key['sq_bucket']}"
            f"_sk{key['sk_bucket']}_bh{key.get('bh_bucket', 0)}{layout}")


def _first_line(name: str) -> str:
    return f"// {name}: attention tile constants tuned by FlashCore tuner"


def is_header_export(out: Path, name: str) -> bool:
    """`out` holds an earlier header export `name` (its header starts with the line this module writes)."""
    try:
        with open(out / f"{name}.h", encoding="utf-8") as f:
            return f.readline().startswith(_first_line(name))
    except (OSError, ValueError):
        return False


def _launch_lines(template: Optional[Manifest]) -> list[str]:
    """How to launch the template's kernels: the grid and the parameters, as tuner/runtime/shipped/launcher.py does."""
    resources = template.resources if template is not None else {}
    lines = []
    if "tma_swizzle" in resources:
        lines.append("// Parameters: first one 4-D TMA tensor map (D, S, H, B) per input q, k, v (see the template's "
                     "header comment), then the tensors, then heads and batch.")
    if "descales" in resources and "kv_fp8" in resources:
        lines += ["// Then q_descale, k_descale, v_descale (const float*; nullptr, nullptr, nullptr for 16-bit K/V).",
                  "// An FP8 KV cache's kernels (dtype *_kv_e4m3: __nv_fp8_e4m3 k and v, q and o of Element) take",
                  "// nullptr and the cache's k_scale and v_scale, float [B, Hkv] contiguous (real = stored * scale)."]
    elif "descales" in resources:
        lines += ["// Then q_descale, k_descale, v_descale (const float*, [B, Hkv] contiguous; nullptr for 16-bit",
                  "// inputs). e4m3 kernels write bf16 and read V as V^T [B, Hkv, D, Sk rounded up to 16], the keys",
                  "// of every 16 in the order 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15, zero past Sk (the map of v",
                  "// is that tensor's, boxes of all D rows; tuner/runtime/shipped/fp8.py makes it)."]
    if "workspace_merge" in resources:
        lines += ["// Decode kernels (sm_80+) take, after the tensors: seq_lens (const int*, per-row key lengths, or",
                  "// nullptr), block_table (const int*, [B, pages_per_seq] of a paged K/V cache, or nullptr for dense",
                  "// K/V), log2 of the page size, pages_per_seq, then workspace (float*, at least row blocks x Hkv x B",
                  "// x Cfg::SPLITS x Cfg::BM x (D + 2) floats) and counters (int*, row blocks x Hkv x B ints, zero",
                  "// before the first launch; the kernel puts them back to zero; one pair per stream, and one",
                  "// per captured CUDA graph, zeroed inside it).",
                  "// Launch: grid (row blocks * Cfg::SPLITS, Hkv, B), row blocks = ceil(Sq * H / Hkv / Cfg::BM): the",
                  "// rows are (query, head of the GQA group) pairs; no cluster; block Cfg::THREADS, dynamic shared",
                  "// memory Cfg::SMEM_BYTES"]
    elif "splits" in resources:
        lines += ["// Decode kernels take four more parameters after the descales: seq_lens (const int*, per-row key",
                  "// lengths, or nullptr), block_table (const int*, [B, pages_per_seq] of a paged K/V cache, or",
                  "// nullptr for dense K/V), log2 of the page size, pages_per_seq; dense without lengths: nullptr,",
                  "// nullptr, 0, 0.",
                  "// Launch: grid (ceil(Sq * H / Hkv / Cfg::BM) * Cfg::SPLITS, Hkv, B): the rows are (query, head",
                  "// of the GQA group) pairs and each row block is one cluster of Cfg::SPLITS CTAs (above 8: allow",
                  "// cudaFuncAttributeNonPortableClusterSizeAllowed); block Cfg::THREADS, dynamic shared memory",
                  "// Cfg::SMEM_BYTES"]
    elif "persistent" in resources:
        lines += ["// Launch: grid (ceil(Sq / Cfg::BM), H, B), or (min(its CTAs, SM count), 1, 1) when",
                  "// Cfg::PERSISTENT; block Cfg::THREADS, dynamic shared memory Cfg::SMEM_BYTES",
                  "// Packed kernels (PACKED: FlashAttention's varlen form) take cu_seqlens_q and cu_seqlens_k after the",
                  "// descales (const int*, [B + 1] cumulative lengths); their maps and strides are of the packed",
                  "// [total, H, D] tensors as [1, H, total, D], Sq and Sk the longest sequence's, B the sequences."]
    else:
        lines.append("// Launch: grid (ceil(Sq / Cfg::BM), H, B), block Cfg::THREADS, dynamic shared memory Cfg::SMEM_BYTES")
    return lines + ["// (above 48 KiB, opt in with cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, "
                    "...))."]


def _preamble(name: str, profile: GpuProfile, manifest: dict[str, Any], template_file: str,
              template: Optional[Manifest] = None) -> list[str]:
    guard = f"{name.upper()}_TUNED_H"
    ns = f"{name}::{profile.name}"
    config = template.config if template is not None else "fc::AttnConfig"
    attributes = f" {template.entry_attributes.replace('TunerCfg', 'Cfg')}" if template and template.entry_attributes else ""
    return [
        f"{_first_line(name)} {manifest['tuner_version']}",
        f"// for {profile.display_name} ({profile.nvcc_arch}), exported {manifest['exported_at']}.",
        *([f"// REPLAYED: timings answered from a recording ({', '.join(manifest['replayed_from'])}), "
           "not measured by the runs exported here."] if manifest.get("replayed_from") else []),
        "// Generated file: re-export instead of editing.",
        "//",
        f'// Use: #include "{template_file}" ({config}, ATTN_FWD_PARAMS, ATTN_FWD_BODY), then this header:',
        f"//   using Cfg = {ns}::<bucket>::Config;",
        f"//   extern \"C\" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS){attributes}",
        "//   my_attention(ATTN_FWD_PARAMS) { ATTN_FWD_BODY(Cfg) }",
        *_launch_lines(template),
        "// Buckets: sq/sk bucket b = ceil(log2 S) holds lengths (2^(b-1), 2^b]; group = H / Hkv.",
        "// WINDOW_LEFT / WINDOW_RIGHT / SOFTCAP: the window (FlashAttention's window_size, -1 unbounded) and",
        "// logit softcap (0 off) compiled into the bucket's kernel; a call runs only a kernel of its own.",
        "// PAGE_SIZE / SEQ_LENS: the K/V layout the bucket was tuned on (page rows, 0 dense; per-row key lengths):",
        "// not compiled in (a decode kernel reads any), they rank the buckets in nearest_bucket().",
        "#pragma once",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <cmath>",
        "",
        f"#define {name.upper()}_ARCH \"{profile.nvcc_arch}\"",
        "",
        f"namespace {name} {{",
        f"namespace {profile.name} {{",
        "",
    ]


def _bucket_struct(e: dict[str, Any], k: ExportedKernel) -> list[str]:
    """One tuned bucket: its key and tunables as constexpr, and the Config the tuner measured."""
    key = e["key"]
    ratio = f", {e['ratio_to_best_baseline']:.2f}x best baseline" if e.get("ratio_to_best_baseline") else ""
    lines = [
        f"// {e['problem_label']}: trial {e['trial_id']}, {e['median_us']:.1f} us{ratio}; {e['kernel']}",
        f"struct {_struct_name(key)} {{",
        # An FP8 KV cache's Element is q's type (k and v are __nv_fp8_e4m3: the decode template's KvE4m3 config).
        f"  using Element = {spec(key['dtype']).query.cxx};  // q, k, v",
        f"  using Output = {spec(key['dtype']).output.cxx};",
        f"  static constexpr int HEAD_DIM = {key['head_dim']};",
        f"  static constexpr bool CAUSAL = {'true' if key['causal'] else 'false'};",
        f"  static constexpr int GROUP = {key['group']};",
        f"  static constexpr int SQ_BUCKET = {key['sq_bucket']};",
        f"  static constexpr int SK_BUCKET = {key['sk_bucket']};",
        f"  static constexpr int BH_BUCKET = {key.get('bh_bucket', 0)};",
        f"  static constexpr int WINDOW_LEFT = {_mask_of(key)[0]};",
        f"  static constexpr int WINDOW_RIGHT = {_mask_of(key)[1]};",
        f"  static constexpr float SOFTCAP = {_mask_of(key)[2]!r}f;",
        f"  static constexpr int PAGE_SIZE = {_layout_of(key)[0]};  // tuned K/V page rows (0: dense)",
        f"  static constexpr bool SEQ_LENS = {'true' if _layout_of(key)[1] else 'false'};  // tuned with per-row lengths",
        f"  static constexpr bool PACKED = {'true' if key.get('packed') else 'false'};  // packed sequences (varlen)",
        # The package runs SDPA for such a cell (its kernel measured slower than it); a C++ caller decides.
        f"  static constexpr bool SLOWER_THAN_SDPA = {'true' if e.get('route') == 'sdpa' else 'false'};",
    ]
    for pname, value in k.variant.params.items():
        if isinstance(value, str):
            lines.append(f'  static constexpr const char* {pname} = "{value}";')
        elif isinstance(value, bool):
            lines.append(f"  static constexpr bool {pname} = {'true' if value else 'false'};")
        else:
            lines.append(f"  static constexpr int {pname} = {value};")
    return lines + [f"  using Config = {config_of(k.source)};", "};", ""]


def _lookup_function(chosen: list[dict[str, Any]]) -> list[str]:
    """nearest_bucket(): the same choice as the Python dispatch, over the structs' keys."""
    rows = ", ".join(f"{{{DTYPE_CODES[e['key']['dtype']]}, {e['key']['head_dim']}, "
                     f"{'true' if e['key']['causal'] else 'false'}, {e['key']['group']}, {e['key']['sq_bucket']}, "
                     f"{e['key']['sk_bucket']}, {e['key'].get('bh_bucket', 0)}, {int(e.get('trial_id', 0))}, "
                     f"{seq_bucket(int(e['max_seq_q'])) if e.get('max_seq_q') else -1}, "
                     f"{_mask_of(e['key'])[0]}, {_mask_of(e['key'])[1]}, {_mask_of(e['key'])[2]!r}, "
                     f"{_layout_of(e['key'])[0]}, {'true' if _layout_of(e['key'])[1] else 'false'}, "
                     f"{'true' if e['key'].get('packed') else 'false'}}}"
                     for e in chosen)
    return [
        "// Index into the structs above of the nearest tuned bucket (-1: dtype/head dim/causality not tuned).",
        "// dtype: 0 = fp16, 1 = bf16, 2 = e4m3 (__nv_fp8_e4m3 inputs with descales, bf16 output), 3 / 4 = an",
        "// FP8 KV cache with fp16 / bf16 q and output (__nv_fp8_e4m3 k and v with k_scale and v_scale).",
        "// group < 1 counts as 1. Same choice as the Python dispatch (_dispatch.DispatchTable.choose): fewest",
        "// |d sq| + |d sk| bucket steps + |d log2 page_size| (dense counts as 512: one past the largest page), then",
        "// its own causality, then nearest group in |d log2 group|, then nearest batch x heads bucket, then its",
        "// own seq_lens (per-row key lengths; a paged call has them), then the larger sq, then the larger sk",
        "// bucket, then the older trial. page_size and seq_lens only rank: any decode kernel reads any of them.",
        "// A short-query (decode) kernel",
        "// (max_sq >= 0) takes no query past its Sq bucket. One query (sq_bucket 0) is the same computation",
        "// causal or not: it also takes the other causality's buckets, after its own at the same distance.",
        "// The window and softcap must be the bucket's own (window_right 0 is causality: causal with -1); one query takes the",
        "// other causality's buckets of its window_left and softcap with no right bound.",
        "inline int nearest_bucket(int dtype, int head_dim, bool causal, int group, int sq_bucket, int sk_bucket,",
        "                          int bh_bucket, int window_left = -1, int window_right = -1, double softcap = 0.0,",
        "                          int page_size = 0, bool seq_lens = false, bool packed = false) {",
        "  struct Row { int dtype, head_dim; bool causal; int group, sq, sk, bh; long long trial; int max_sq;",
        "               int wl, wr; float sc; int page; bool lens, packed; };",
        "  if (window_right == 0) causal = true;  // a right bound of 0 is causality: one spelling, as Python's",
        "  if (page_size > 0) seq_lens = true;  // a paged call has per-row lengths",
        f"  auto page_log2 = [](int p) {{ int l = {DENSE_PAGE_LOG2}; if (p > 0) {{ l = 0; "
        "while ((2 << l) <= p) ++l; } return l; };",
        "  const int wr = window_right == 0 ? -1 : window_right;",
        "  const float sc = static_cast<float>(softcap);  // the bucket's SOFTCAP is a float",
        f"  static const Row rows[] = {{{rows}}};",
        "  const double lg = std::log2(static_cast<double>(group > 1 ? group : 1));",
        "  int best = -1, best_d = 0, best_w = 0, best_x = 0, best_l = 0;",
        "  double best_g = 0.0;",
        f"  for (int i = 0; i < {len(chosen)}; ++i) {{",
        "    const Row& r = rows[i];",
        "    if (r.dtype != dtype || r.head_dim != head_dim || (r.causal != causal && sq_bucket != 0)) continue;",
        "    if (r.wl != window_left || r.sc != sc || r.wr != (r.causal == causal ? wr : -1)) continue;",
        "    if (r.max_sq >= 0 && sq_bucket > r.max_sq) continue;",
        "    if (r.packed != packed) continue;  // packed sequences: the kernel's parameters, compiled in",
        "    const int pd = page_log2(r.page) - page_log2(page_size);",
        "    const int d = (r.sq > sq_bucket ? r.sq - sq_bucket : sq_bucket - r.sq) + (r.sk > sk_bucket ? r.sk - sk_bucket : sk_bucket - r.sk)",
        "                  + (pd > 0 ? pd : -pd);",
        "    const int x = r.causal != causal ? 1 : 0;",
        # The same double arithmetic as Python's abs(math.log2(g) - math.log2(group)): ties break identically.
        "    const double g = std::fabs(std::log2(static_cast<double>(r.group)) - lg);",
        "    const int w = r.bh > bh_bucket ? r.bh - bh_bucket : bh_bucket - r.bh;",
        "    const int l = r.lens != seq_lens ? 1 : 0;",
        "    bool better = best < 0;",
        "    if (!better) {",
        "      const Row& b = rows[best];",
        "      better = d != best_d ? d < best_d : x != best_x ? x < best_x : g != best_g ? g < best_g",
        "             : w != best_w ? w < best_w : l != best_l ? l < best_l",
        "             : r.sq != b.sq ? r.sq > b.sq : r.sk != b.sk ? r.sk > b.sk : r.trial < b.trial;",
        "    }",
        "    if (better) { best = i; best_d = d; best_g = g; best_w = w; best_x = x; best_l = l; }",
        "  }",
        "  return best;",
        "}",
    ]


def render_header(name: str, profile: GpuProfile, manifest: dict[str, Any], built: dict[str, ExportedKernel],
                  template_file: str, template: Optional[Manifest] = None) -> str:
    chosen = [e for e in manifest["entries"] if e["dispatch"]]
    lines = _preamble(name, profile, manifest, template_file, template)
    for e in chosen:
        lines += _bucket_struct(e, built[e["kernel"]])
    lines += _lookup_function(chosen)
    guard = f"{name.upper()}_TUNED_H"
    lines += ["", f"}}  // namespace {profile.name}", f"}}  // namespace {name}", "", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def write_header(options: ExportOptions, name: str, profile: GpuProfile, manifest: dict[str, Any],
                 built: dict[str, ExportedKernel]) -> ExportReport:
    templates = {k.variant.template for k in built.values()}
    if len(templates) != 1:
        raise TunerError(f"a header export takes kernels of one template; these come from {sorted(templates)}")
    template = load_manifest(templates.pop())
    template_path = template.source_path
    header = f"{name}.h"
    # The template source and the headers it includes (common/, <template>/), laid out as under
    # kernel_templates/: `#include "<template>.cu"` then compiles with no -I.
    names = [header, *sorted({rel.split("/")[0] for rel in template.files})]
    check_out(options.out, options.force, names, is_header_export(options.out, name))
    text = render_header(name, profile, manifest, built, template_path.name, template)

    def write(root: Path) -> list[Path]:
        copied = []
        for rel, path in template.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, root / rel)
            copied.append(root / rel)
        (root / header).write_text(text)
        return [root / header, *copied]

    files = write_staged(options.out, names, write)
    return ExportReport(options.out, "header", name, manifest["entries"], len(built), files)
