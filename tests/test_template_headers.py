"""Templates split into headers: which files a template is made of, what hashes them, how they compile.

A rendered template #includes headers relative to the templates folders
(common/, attn_fwd_mma/, attn_fwd_wgmma/). Editing any of them must change the
template's source_hash (stored with every trial) and the compile cache key;
enum-valued parameters reach the source by their C++ name.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from tuner.assets import asset_dir
from tuner.errors import TunerError
from tuner.kernels import compiler
from tuner.kernels.compiler import cache_key, compile_source
from tuner.kernels.manifest import (
    find_headers,
    inline_headers,
    list_templates,
    load_manifest,
    load_manifest_file,
    template_folders,
)
from tuner.kernels.render import render
from tuner.kernels.variant import parse_variant_name

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)")

TINY_TOML = """\
name = "tiny_tpl"
source = "tiny_tpl.cu"
config = "tiny::Cfg"
archs = ["sm_80"]
min_compute_capability = [8, 0]
name_format = "m{BLOCK_M}"
config_args = ["BLOCK_M"]
[features]
head_dims = [64]
dtypes = ["fp16"]
causal = false
gqa = false
layouts = ["bhsd"]
[params.BLOCK_M]
values = [64]
[resources]
threads = "128"
min_blocks = "1"
smem_bytes = "0"
"""


def _tiny_template(folder: Path) -> Path:
    """A template of its own folder: a source, a header of its own and one shipped common/ header."""
    (folder / "tiny_tpl").mkdir(parents=True)
    (folder / "tiny_tpl.toml").write_text(TINY_TOML)
    (folder / "tiny_tpl.cu").write_text('#include "tiny_tpl/inner.h"\n#include <stdint.h>\n')
    (folder / "tiny_tpl" / "inner.h").write_text('#pragma once\n#include "more.h"  // next to this header\n'
                                                 '#include "common/utils.h"\n')
    (folder / "tiny_tpl" / "more.h").write_text("#pragma once\nconstexpr int TINY = 1;\n")
    return folder / "tiny_tpl.toml"


@pytest.fixture
def template_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TUNER_TEMPLATE_PATH", str(tmp_path / "templates"))
    load_manifest.cache_clear()
    yield tmp_path / "templates"
    load_manifest.cache_clear()


def test_shipped_templates_list_their_headers() -> None:
    shipped = asset_dir("kernel_templates")
    for manifest in list_templates():
        rels = list(manifest.files)
        assert rels[0] == manifest.source_path.name and manifest.files[rels[0]] == manifest.source_path
        # The forward's argument list; the backward templates share attn_bwd_mma's (the launcher's ARG_FORMAT).
        args = "common/attn_args.h" if manifest.kernel_pass == "forward" else "attn_bwd_mma/args.h"
        assert {"common/utils.h", args} <= set(rels)
        # Its config: in a folder of its own, or shared (attn_decode_sm80 instantiates attn_decode's DecodeConfig).
        assert f"{manifest.name}/config.h" in rels or manifest.name.startswith("attn_decode")
        assert any(rel.endswith("/config.h") for rel in rels)
        assert rels[1:] == sorted(rels[1:])
        for rel, path in manifest.files.items():
            assert path == shipped / rel and path.is_file()


def test_headers_resolve_next_to_the_includer_then_from_the_root(template_path: Path) -> None:
    _tiny_template(template_path)
    manifest = load_manifest("tiny_tpl")
    assert list(manifest.files) == ["tiny_tpl.cu", "common/cuda_types.h", "common/utils.h", "tiny_tpl/inner.h",
                                    "tiny_tpl/more.h"]  # utils.h's own include, cuda_types.h, from the root
    assert manifest.files["common/utils.h"] == asset_dir("kernel_templates") / "common" / "utils.h"
    assert manifest.include_dirs == template_folders()


def test_inlining_pastes_each_header_once_where_it_is_first_included(template_path: Path) -> None:
    _tiny_template(template_path)
    source = template_path / "tiny_tpl.cu"
    source.write_text(source.read_text() + '#include "tiny_tpl/more.h"\n#include "not/here.h"\n')
    manifest = load_manifest("tiny_tpl")
    text = inline_headers(manifest.source, manifest.include_dirs)
    begins = re.findall(r"^// ---- begin (\S+) ----$", text, re.MULTILINE)
    # Depth first, as the preprocessor reads them; each header's path in its templates folder.
    assert begins == ["templates/tiny_tpl/inner.h", "templates/tiny_tpl/more.h", "kernel_templates/common/utils.h",
                      "kernel_templates/common/cuda_types.h"]
    assert text.index("constexpr int TINY = 1;") < text.index("// ---- end templates/tiny_tpl/inner.h ----")
    assert text.count("constexpr int TINY = 1;") == 1
    assert '// #include "tiny_tpl/more.h": templates/tiny_tpl/more.h, inlined above' in text
    assert "#pragma once" not in text  # nvcc warns of one in the main file
    assert "#include <stdint.h>\n" in text and '#include "not/here.h"\n' in text  # left to nvcc, as find_headers does
    assert find_headers(text, manifest.include_dirs) == {}


def test_editing_a_header_changes_the_source_hash(template_path: Path) -> None:
    path = _tiny_template(template_path)
    before = load_manifest_file(path).source_hash
    (template_path / "tiny_tpl" / "more.h").write_text("#pragma once\nconstexpr int TINY = 2;\n")
    assert load_manifest_file(path).source_hash != before


def test_a_template_without_headers_keeps_its_hash(tmp_path: Path) -> None:
    (tmp_path / "plain.toml").write_text(TINY_TOML.replace("tiny_tpl", "plain"))
    (tmp_path / "plain.cu").write_text("#include <stdint.h>\n")
    m = load_manifest_file(tmp_path / "plain.toml")
    text = (tmp_path / "plain.toml").read_text() + "\0" + (tmp_path / "plain.cu").read_text()
    assert list(m.files) == ["plain.cu"]
    assert m.source_hash == hashlib.sha256(text.encode()).hexdigest()  # the formula before headers existed


def test_a_shadowed_header_is_an_error(template_path: Path) -> None:
    path = _tiny_template(template_path)
    (template_path / "common").mkdir()
    (template_path / "common" / "utils.h").write_text("// my own\n")  # the shipped common/utils.h comes first
    with pytest.raises(TunerError, match="common/utils.h of this template is shadowed by") as info:
        load_manifest_file(path)
    assert str(path) in str(info.value)


def test_cache_key_covers_the_included_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "nvcc_version", lambda: "13.0.88")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.h").write_text("#pragma once\n")
    source = '#include "lib/a.h"\n#include "lib/missing.h"\n'
    headers = find_headers(source, (tmp_path,))
    assert headers == {"lib/a.h": tmp_path / "lib" / "a.h"}  # not found: left to nvcc
    key = cache_key(source, "sm_80", headers={r: p.read_bytes() for r, p in headers.items()})
    assert key != cache_key(source, "sm_80", headers={"lib/a.h": b"#pragma once\n// edited\n"})
    assert cache_key("plain", "sm_80") == cache_key("plain", "sm_80", headers={})


def test_enum_parameters_reach_the_source_by_name() -> None:
    for swizzle, spelling in (("none", "None"), ("pad", "Pad"), ("xor", "Xor")):
        src = render(parse_variant_name(f"attn_fwd_mma_d64_fp16_m64n64_w4_q_rows_{swizzle}_s2_qsmem"))
        assert (f"fc::AttnConfig<half, 64, 64, 64, 4, 1, fc::Swizzle::{spelling}, 2, false, 1, false, false, "
                "fc::NoMask>") in src


def _copy_mma_template(tmp_path: Path) -> Path:
    src = asset_dir("kernel_templates")
    for name in ("attn_fwd_mma.toml", "attn_fwd_mma.cu"):
        shutil.copy(src / name, tmp_path / name)
    return tmp_path / "attn_fwd_mma.toml"


CXX_LINE = 'cxx = { none = "fc::Swizzle::None", pad = "fc::Swizzle::Pad", xor = "fc::Swizzle::Xor" }\n'


@pytest.mark.parametrize(
    ("replacement", "message"),
    [
        ("", r"\[params.SWIZZLE\] string value\(s\) 'none', 'pad', 'xor' have no C\+\+ spelling"),
        (CXX_LINE.replace(', xor = "fc::Swizzle::Xor"', ""), r"\[params.SWIZZLE\] string value\(s\) 'xor' have no C\+\+"),
        (CXX_LINE.replace("xor = ", "xxor = "), r"\[params.SWIZZLE\] cxx names 'xxor', not among its values"),
        (CXX_LINE.replace('"fc::Swizzle::Pad"', '"1); evil("'), "are not C\\+\\+ names"),
        ('cxx = "fc::Swizzle"\n', "cxx must be a table"),
    ],
)
def test_enum_spellings_are_validated(tmp_path: Path, replacement: str, message: str) -> None:
    path = _copy_mma_template(tmp_path)
    text = path.read_text()
    assert CXX_LINE in text
    path.write_text(text.replace(CXX_LINE, replacement))
    with pytest.raises(TunerError, match=message) as info:
        load_manifest_file(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.nvcc
@needs_nvcc
def test_compile_sees_exactly_the_hashed_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    inc = tmp_path / "inc"
    (inc / "lib").mkdir(parents=True)
    (inc / "lib" / "value.h").write_text("#pragma once\n#define VALUE 1.0f\n")
    src = '#include "lib/value.h"\nextern "C" __global__ void hdr(float* x) { x[threadIdx.x] = VALUE; }\n'
    first = compile_source(src, "hdr", "sm_80", include_dirs=(inc,))
    again = compile_source(src, "hdr", "sm_80", include_dirs=(inc,))
    assert first.ok and again.cached and again.cubin_sha256 == first.cubin_sha256
    # Same headers elsewhere (another install of the templates): same key, same bytes.
    moved = tmp_path / "elsewhere"
    shutil.copytree(inc, moved)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache2"))
    other = compile_source(src, "hdr", "sm_80", include_dirs=(moved,), use_cache=False)
    assert other.ok and other.cubin_sha256 == first.cubin_sha256
    # An edited header is a new compile, not a cached cubin.
    (inc / "lib" / "value.h").write_text("#pragma once\n#define VALUE 2.0f\n")
    edited = compile_source(src, "hdr", "sm_80", include_dirs=(inc,))
    assert edited.ok and not edited.cached and edited.cubin_sha256 != first.cubin_sha256
    # A header nvcc was not given (not under include_dirs) fails the compile instead of going stale.
    missing = compile_source(src, "hdr", "sm_80", include_dirs=(tmp_path / "nothing",))
    assert not missing.ok and "lib/value.h" in missing.log
