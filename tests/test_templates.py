"""Template manifests: loading, validation errors, source hashing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tuner.assets import asset_dir
from tuner.errors import TunerError
from tuner.kernels.manifest import list_templates, load_manifest, load_manifest_file
from tuner.kernels.variant import Variant, parse_variant_name


def test_shipped_manifest_loads() -> None:
    m = load_manifest("attn_fwd_mma")
    assert "attn_fwd_mma" in [t.name for t in list_templates()]
    assert set(m.params) == {"BLOCK_M", "BLOCK_N", "NUM_WARPS", "KV_SPLIT", "SWIZZLE", "STAGES", "Q_IN_REGS", "MIN_BLOCKS", "LAZY_RESCALE"}
    assert {64, 128} <= set(m.features.head_dims) and set(m.features.dtypes) == {"fp16", "bf16"}
    assert "sm_80" in m.archs and "sm_90a" in m.archs
    assert len(m.source_hash) == 64


def test_unknown_template_lists_known() -> None:
    with pytest.raises(TunerError, match="known: .*attn_fwd_mma"):
        load_manifest("nope")


def _copy_template(tmp_path: Path) -> Path:
    src = asset_dir("kernel_templates")
    for name in ("attn_fwd_mma.toml", "attn_fwd_mma.cu"):
        shutil.copy(src / name, tmp_path / name)
    return tmp_path / "attn_fwd_mma.toml"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('name = "attn_fwd_mma"\n', ""), "missing field 'name'"),
        (lambda t: t.replace('source = "attn_fwd_mma.cu"', 'source = "gone.cu"'), "gone.cu not found"),
        (lambda t: t.replace("values = [32, 64, 128]\ndoc = \"query", "values = \"64\"\ndoc = \"query"), "values"),
        (lambda t: t.replace("{BLOCK_M}", "BM"), "name_format must contain {BLOCK_M}"),
        (lambda t: t + "\n[broken", "cannot read manifest"),
        (lambda t: t.replace('[params.LAZY_RESCALE]\n', '[params.LAZY_RESCALE]\nabsent = 3\n'), "absent = 3 is not one"),
    ],
)
def test_broken_manifest_errors_name_file_and_field(tmp_path: Path, edit, message: str) -> None:
    path = _copy_template(tmp_path)
    path.write_text(edit(path.read_text()))
    with pytest.raises(TunerError, match=message) as info:
        load_manifest_file(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_source_hash_changes_with_the_template(tmp_path: Path) -> None:
    path = _copy_template(tmp_path)
    before = load_manifest_file(path).source_hash
    cu = tmp_path / "attn_fwd_mma.cu"
    cu.write_text(cu.read_text() + "\n// changed\n")
    assert load_manifest_file(path).source_hash != before


def test_a_parameter_added_later_keeps_the_stored_variants_from_before_it() -> None:
    """attn_fwd_wgmma's TWO_P (absent = false): a stored variant without it loads as TWO_P false, and a TWO_P false
    variant's stored identity is the one it had before the parameter; a TWO_P true one names it."""
    name = "attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp"
    old = parse_variant_name(name).stored_params()
    assert "TWO_P" not in old
    assert Variant.from_stored("attn_fwd_wgmma", old).params["TWO_P"] is False
    two_p = parse_variant_name(name + "_2p")
    assert two_p.stored_params()["TWO_P"] is True and Variant.from_stored("attn_fwd_wgmma", two_p.stored_params()) == two_p
    assert load_manifest("attn_fwd_wgmma").with_absent({"TWO_P": True}) == {"TWO_P": True}
