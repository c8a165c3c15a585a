"""`tuner render`: one file nvcc compiles alone, for every name form the CLI prints.

The rendered file inlines the template's headers (nvcc needs no -I) and its
first lines give the nvcc command; `render` takes a trial id, a full variant
name, or the tunables part `tuner results` and the search summary print,
completed from --template/--head-dim/--dtype or from the stored trials.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_tuner
from store_factories import H100, trial

from tuner.kernels.compiler import compile_source
from tuner.kernels.manifest import find_headers, load_manifest, template_folders
from tuner.kernels.render import nvcc_command, render, render_standalone
from tuner.kernels.variant import Variant, parse_variant_name, short_name
from tuner.problem import Problem
from tuner.store import RunInfo, open_store

NO_ENV = {"TUNER_DB": None}
A100 = RunInfo(gpu_name="NVIDIA A100-SXM4-80GB", profile="a100")
# One variant of each template that compiles (a covering sample's), and the arch each builds for first.
COMPILED = {
    "attn_fwd_wgmma_d64_fp16_m192n80_s4_sw32_r24_pp": "sm_90a",
    "attn_decode_d64_fp16_m32n128_w2_sp8_s3": "sm_90a",
    "attn_decode_sm80_d64_fp16_m64n64_w4_sp1_s4": "sm_80",
    "attn_fwd_mma_d64_fp16_m64n128_w4_kv4_pad_s3_qreg_lr": "sm_80",
}
WG = "attn_fwd_wgmma_d64_fp16_m192n80_s4_sw32_r24_pp"
MMA_SHORT = "m128n64_w4_q_rows_xor_s2_qreg"  # stored for head dims 64 and 128
DECODE_SHORT = "m64n64_w4_sp1_s2"  # a name of both attn_decode and attn_decode_sm80; stored for the latter


def tuner(url: str, *args: str):
    return run_tuner("--db", url, *args, env=NO_ENV)


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout[:300], result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def _record(run_id: int, name: str, problem: Problem, template_hash: str | None = None):
    v = parse_variant_name(name)
    return trial(run_id, problem, template=v.template, params=v.stored_params(), variant_name=v.name,
                 template_hash=template_hash or load_manifest(v.template).source_hash)


@pytest.fixture
def stored(sqlite_url):
    """Trials of real variants: a wgmma one on an H100, and on an A100 one mma name at two head dims,
    a decode name of attn_decode_sm80 and a trial measured with an older template."""
    with open_store(sqlite_url) as store:
        h100, a100 = store.start_run(H100), store.start_run(A100)
        ids = {
            "wg": store.add_trial(_record(h100, WG, Problem(1, 8, 1024, 1024, 64))),
            "mma64": store.add_trial(_record(a100, f"attn_fwd_mma_d64_fp16_{MMA_SHORT}", Problem(1, 8, 512, 512, 64))),
            "mma128": store.add_trial(_record(a100, f"attn_fwd_mma_d128_fp16_{MMA_SHORT}",
                                              Problem(1, 8, 512, 512, 128))),
            "decode": store.add_trial(_record(a100, f"attn_decode_sm80_d64_bf16_{DECODE_SHORT}",
                                              Problem(4, 8, 1, 4096, 64, dtype="bf16"))),
            "stale": store.add_trial(_record(a100, "attn_fwd_mma_d64_fp16_m64n64_w4_q_rows_xor_s2_qreg",
                                             Problem(2, 8, 512, 512, 64), template_hash="0123456789abcdef")),
        }
    return sqlite_url, ids


def _first_line(text: str) -> str:
    return text.splitlines()[0]


def test_render_takes_the_names_results_and_show_print(stored) -> None:
    url, ids = stored
    table = tuner(url, "results", "--gpu", "h100")
    assert table.exit_code == 0 and short_name(WG) in table.stdout and WG not in table.stdout
    assert WG in tuner(url, "show", str(ids["wg"])).stdout
    outputs = [tuner(url, "render", name) for name in (WG, short_name(WG), str(ids["wg"]))]
    assert all(r.exit_code == 0 and not r.stderr for r in outputs), [r.stderr for r in outputs]
    assert outputs[0].stdout == outputs[1].stdout == outputs[2].stdout == render_standalone(parse_variant_name(WG))


def test_a_short_name_resolves_from_the_store_with_the_cards_arch(stored) -> None:
    url, _ = stored
    result = tuner(url, "render", DECODE_SHORT)
    assert result.exit_code == 0, result.stderr
    assert _first_line(result.stdout) == f"// attn_decode_sm80_d64_bf16_{DECODE_SHORT}"
    assert "-gencode arch=compute_80,code=sm_80" in result.stdout  # stored on an A100


def test_a_short_name_several_stored_variants_share_asks_for_what_tells_them_apart(stored) -> None:
    url, _ = stored
    assert_one_line_error(tuner(url, "render", MMA_SHORT), "names 2 stored variants", "give --head-dim (64 or 128)",
                          f"attn_fwd_mma_d64_fp16_{MMA_SHORT}")
    result = tuner(url, "render", MMA_SHORT, "--head-dim", "128")
    assert result.exit_code == 0, result.stderr
    assert _first_line(result.stdout) == f"// attn_fwd_mma_d128_fp16_{MMA_SHORT}"


def test_a_short_name_no_trial_has_asks_for_every_missing_option(stored) -> None:
    url, _ = stored
    assert_one_line_error(tuner(url, "render", DECODE_SHORT, "--gpu", "h100"), "no stored trial matching these options",
                          "give --template (attn_decode or attn_decode_sm80), --head-dim (64 or 128) and --dtype "
                          "(bf16, bf16_kv_e4m3, fp16 or fp16_kv_e4m3)")


def test_options_complete_a_short_name_without_a_store(tmp_path: Path) -> None:
    nowhere = f"sqlite:///{tmp_path / 'none.db'}"  # opening it would fail: the options alone must do
    by_short = tuner(nowhere, "render", DECODE_SHORT, "--template", "attn_decode", "--head-dim", "64", "--dtype", "fp16")
    by_full = tuner(nowhere, "render", f"attn_decode_d64_fp16_{DECODE_SHORT}")
    assert by_short.exit_code == 0 and by_full.exit_code == 0, by_short.stderr + by_full.stderr
    assert by_short.stdout == by_full.stdout


def test_a_trial_of_an_older_template_renders_todays_with_a_warning(stored) -> None:
    url, ids = stored
    result = tuner(url, "render", str(ids["stale"]))
    assert result.exit_code == 0
    assert _first_line(result.stdout) == "// attn_fwd_mma_d64_fp16_m64n64_w4_q_rows_xor_s2_qreg"
    assert result.stderr.startswith(f"warning: trial {ids['stale']} measured attn_fwd_mma @ 0123456789ab; the "
                                    "template has changed")


@pytest.mark.parametrize(("args", "fragments"), [
    (("xyz",), ("not a trial id or variant name: 'xyz'", "as `tuner results` prints it")),
    (("m128n64_w4_q_rows_xor_s9_qreg",), ("not a trial id or variant name",)),
    (("attn_fwd_mma_d64_fp16_garbage",), ("not a variant name: 'attn_fwd_mma_d64_fp16_garbage'",)),
    (("attn_fwd_mma_d80_fp16_" + MMA_SHORT,), ("head dim 80 unsupported",)),
    (("999",), ("no trial with id 999",)),
    ((MMA_SHORT, "--template", "attn_fwd_wgmma"), ("not the tunables part of a variant name of attn_fwd_wgmma",)),
    ((MMA_SHORT, "--template", "nope"), ("unknown kernel template 'nope'",)),
    ((MMA_SHORT, "--dtype", "fp32"), ("unknown dtype 'fp32'",)),
    ((WG, "--head-dim", "128"), (f"{WG} has --head-dim 64, not 128",)),
    ((WG, "--gpu", "a100"), ("attn_fwd_wgmma is built for sm_90a, not sm_80 (--gpu a100)",)),
])
def test_names_and_options_that_mean_no_variant_are_one_line_errors(stored, args, fragments) -> None:
    url, _ = stored
    assert_one_line_error(tuner(url, "render", *args), *fragments)


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_the_standalone_source_includes_no_project_header(name: str) -> None:
    v = parse_variant_name(name)
    manifest = load_manifest(v.template)
    text = render_standalone(v)
    assert find_headers(text, template_folders()) == {}  # nothing left for an include path to find
    begins = re.findall(r"^// ---- begin (\S+) ----$", text, re.MULTILINE)
    assert sorted(begins) == [f"kernel_templates/{rel}" for rel in list(manifest.files)[1:]]  # each once
    assert text.splitlines()[4] == f"//   {nvcc_command(v, COMPILED[name])}"
    assert text.endswith(render(v).split("// ---- instantiation generated by tuner")[1])


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("name", sorted(COMPILED))
def test_the_rendered_file_compiles_alone_into_the_tuners_cubin(name: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    v: Variant = parse_variant_name(name)
    result = run_tuner("render", name, env=NO_ENV)
    assert result.exit_code == 0, result.stderr
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / f"{name}.cu").write_text(result.stdout)  # no header beside it
    command = result.stdout.splitlines()[4].removeprefix("//   ")  # the command the file gives, run as given
    assert f"code={COMPILED[name]}" in command and not any(t.startswith("-I") for t in shlex.split(command))
    proc = subprocess.run(shlex.split(command), cwd=alone, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tuners = compile_source(render(v), v.name, COMPILED[name], use_cache=False)
    assert tuners.ok and hashlib.sha256((alone / f"{name}.cubin").read_bytes()).hexdigest() == tuners.cubin_sha256
