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
from typing import TYPE_CHECKING, Any

from tuner.errors import TunerError
from tuner.profiles import GpuProfile

if TYPE_CHECKING:
    from tuner.export import BuiltKernel, ExportOptions, ExportReport

_CONFIG = re.compile(r"^using TunerCfg = (.+);$", re.M)


def config_of(source: str) -> str:
    """The fc::AttnConfig<...> type a rendered variant instantiates (taken from the render, not recomputed)."""
    m = _CONFIG.search(source)
    if not m:
        raise TunerError("rendered source has no TunerCfg instantiation; the template's render format changed")
    return m.group(1)


def _struct_name(key: dict[str, Any]) -> str:
    causal = "causal" if key["causal"] else "noncausal"
    return f"{key['dtype']}_d{key['head_dim']}_{causal}_g{key['group']}_sq{key['sq_bucket']}_sk{key['sk_bucket']}"


def render_header(name: str, profile: GpuProfile, manifest: dict[str, Any], built: dict[str, "BuiltKernel"],
                  template_file: str) -> str:
    guard = f"{name.upper()}_TUNED_H"
    ns = f"{name}::{profile.name}"
    lines = [
        f"// {name}: attention tile constants tuned by FlashCore tuner {manifest['tuner_version']}",
        f"// for {profile.display_name} ({profile.nvcc_arch}), exported {manifest['exported_at']}.",
        "// Generated file: re-export instead of editing.",
        "//",
        f'// Use: #include "{template_file}" (fc::AttnConfig, ATTN_FWD_PARAMS, ATTN_FWD_BODY), then this header:',
        f"//   using Cfg = {ns}::<bucket>::Config;",
        "//   extern \"C\" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)",
        "//   my_attention(ATTN_FWD_PARAMS) { ATTN_FWD_BODY(Cfg) }",
        "// Launch: grid (ceil(Sq / Cfg::BM), H, B), block Cfg::THREADS, dynamic shared memory Cfg::SMEM_BYTES",
        "// (above 48 KiB, opt in with cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...)).",
        "// Buckets: sq/sk bucket b = ceil(log2 S) holds lengths (2^(b-1), 2^b]; group = H / Hkv.",
        "#pragma once",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        f"#define {name.upper()}_ARCH \"{profile.nvcc_arch}\"",
        "",
        f"namespace {name} {{",
        f"namespace {profile.name} {{",
        "",
    ]
    chosen = [e for e in manifest["entries"] if e["dispatch"]]
    for e in chosen:
        k = built[e["kernel"]]
        key = e["key"]
        ratio = f", {e['ratio_to_best_baseline']:.2f}x best baseline" if e.get("ratio_to_best_baseline") else ""
        lines.append(f"// {e['problem_label']}: trial {e['trial_id']}, {e['median_us']:.1f} us{ratio}; {e['kernel']}")
        lines.append(f"struct {_struct_name(key)} {{")
        lines.append(f"  static constexpr int HEAD_DIM = {key['head_dim']};")
        lines.append(f"  static constexpr bool CAUSAL = {'true' if key['causal'] else 'false'};")
        lines.append(f"  static constexpr int GROUP = {key['group']};")
        lines.append(f"  static constexpr int SQ_BUCKET = {key['sq_bucket']};")
        lines.append(f"  static constexpr int SK_BUCKET = {key['sk_bucket']};")
        for pname, value in k.variant.params.items():
            cxx = ("true" if value else "false") if isinstance(value, bool) else value
            if isinstance(value, str):
                lines.append(f'  static constexpr const char* {pname} = "{value}";')
            else:
                lines.append(f"  static constexpr {'bool' if isinstance(value, bool) else 'int'} {pname} = {cxx};")
        lines.append(f"  using Config = {config_of(k.source)};")
        lines.append("};")
        lines.append("")
    lines.append("// Index into the structs above of the nearest tuned bucket (-1: dtype/head dim/causality not tuned).")
    lines.append("// dtype: 0 = fp16, 1 = bf16.")
    lines.append("inline int nearest_bucket(int dtype, int head_dim, bool causal, int group, int sq_bucket, int sk_bucket) {")
    lines.append("  struct Row { int dtype, head_dim; bool causal; int group, sq, sk; };")
    rows = ", ".join(f"{{{0 if e['key']['dtype'] == 'fp16' else 1}, {e['key']['head_dim']}, "
                     f"{'true' if e['key']['causal'] else 'false'}, {e['key']['group']}, {e['key']['sq_bucket']}, "
                     f"{e['key']['sk_bucket']}}}" for e in chosen)
    lines.append(f"  static const Row rows[] = {{{rows}}};")
    # Same order as the Python dispatch: bucket distance, then group mismatch, then the larger bucket.
    lines.append("  int best = -1, best_d = 0, best_g = 0, best_s = 0;")
    lines.append(f"  for (int i = 0; i < {len(chosen)}; ++i) {{")
    lines.append("    const Row& r = rows[i];")
    lines.append("    if (r.dtype != dtype || r.head_dim != head_dim || r.causal != causal) continue;")
    lines.append("    const int d = (r.sq > sq_bucket ? r.sq - sq_bucket : sq_bucket - r.sq) + (r.sk > sk_bucket ? r.sk - sk_bucket : sk_bucket - r.sk);")
    lines.append("    const int g = r.group > group ? r.group / group : group / r.group;")
    lines.append("    const int s = r.sq * 64 + r.sk;")
    lines.append("    if (best < 0 || d < best_d || (d == best_d && (g < best_g || (g == best_g && s > best_s)))) {")
    lines.append("      best = i; best_d = d; best_g = g; best_s = s;")
    lines.append("    }")
    lines.append("  }")
    lines.append("  return best;")
    lines.append("}")
    lines += ["", f"}}  // namespace {profile.name}", f"}}  // namespace {name}", "", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def write_header(options: "ExportOptions", name: str, profile: GpuProfile, manifest: dict[str, Any],
                 built: dict[str, "BuiltKernel"]) -> "ExportReport":
    from tuner.export import ExportReport, _prepare_out
    from tuner.templates import load_manifest

    templates = {k.variant.template for k in built.values()}
    if len(templates) != 1:
        raise TunerError(f"a header export takes kernels of one template; these come from {sorted(templates)}")
    template_path = load_manifest(templates.pop()).source_path
    header = f"{name}.h"
    _prepare_out(options.out, options.force, [header, template_path.name])
    shutil.copyfile(template_path, options.out / template_path.name)
    (options.out / header).write_text(render_header(name, profile, manifest, built, template_path.name))
    files = [options.out / header, options.out / template_path.name]
    return ExportReport(options.out, "header", name, manifest["entries"], len(built), files)
