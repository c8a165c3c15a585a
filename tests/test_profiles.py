"""GPU profiles: shipped files, validation, detection logic, `tuner profiles`."""

from __future__ import annotations

import copy
import json
import tomllib
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tuner.assets import asset_dir
from tuner.cli.app import build_app
from tuner.errors import NoGpuError, TunerError
from tuner.problem import Problem
from tuner.profiles import (
    REQUIRED_KEYS,
    DetectedGpu,
    GpuProfile,
    list_profiles,
    load_profile,
    load_profile_file,
    offline_profile,
    profile_from_dict,
    profile_names,
    resolve_profile,
)

SHIPPED = ["a100", "h100", "h200", "l4"]

# Problems every shipped profile must carry (B, H, S, D, causal), fp16.
REQUIRED_PROBLEMS = [
    (16, 16, 2048, 64, False),
    (1, 16, 1024, 64, False),
    (1, 8, 512, 64, False),
    (8, 16, 2048, 128, False),
    (4, 16, 4096, 128, True),
]

H100 = DetectedGpu(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132, uuid="GPU-1")
H100_PCIE = DetectedGpu(index=0, name="NVIDIA H100 PCIe", compute_capability=(9, 0), sm_count=114)
H200 = DetectedGpu(index=0, name="NVIDIA H200", compute_capability=(9, 0), sm_count=132)
GH200 = DetectedGpu(index=0, name="NVIDIA GH200 480GB", compute_capability=(9, 0), sm_count=132)
A100 = DetectedGpu(index=1, name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), sm_count=108)
L4 = DetectedGpu(index=0, name="NVIDIA L4", compute_capability=(8, 9), sm_count=58)
L40S = DetectedGpu(index=0, name="NVIDIA L40S", compute_capability=(8, 9), sm_count=142)


def _raw(name: str) -> dict:
    with (asset_dir("profiles") / f"{name}.toml").open("rb") as fh:
        return tomllib.load(fh)


def _dump_toml(data: dict) -> str:
    """Tiny TOML writer for the value types a profile uses (tests only)."""

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not (isinstance(v, list) and v and isinstance(v[0], dict))]
    for k, v in data.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            for table in v:
                lines.append(f"\n[[{k}]]")
                lines.extend(f"{tk} = {value(tv)}" for tk, tv in table.items())
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ shipped profiles


def test_shipped_profile_names():
    assert profile_names() == SHIPPED
    assert [p.name for p in list_profiles()] == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_and_is_consistent(name):
    profile = load_profile(name)
    assert isinstance(profile, GpuProfile)
    assert profile.name == name
    assert profile.source is not None and profile.source.name == f"{name}.toml"
    assert isinstance(profile.compute_capability, tuple) and len(profile.compute_capability) == 2
    assert profile.nvcc_arch.startswith(profile.arch)
    assert profile.regs_per_thread == 255
    assert profile.max_threads_per_block == 1024
    assert profile.regs_per_sm == 65536
    assert 0 < profile.smem_per_block_optin <= profile.smem_per_sm
    assert profile.peak_fp16_tflops > 0 and profile.peak_bf16_tflops > 0
    assert all(isinstance(p, Problem) for p in profile.default_problems)
    fp16 = {(p.batch, p.heads, p.seq_q, p.head_dim, p.causal) for p in profile.default_problems
            if p.dtype == "fp16" and p.seq_q == p.seq_k and p.heads_kv == p.heads}
    for required in REQUIRED_PROBLEMS:
        assert required in fp16, f"{name} lacks default problem {required}"
    # Same file read through load_profile_file gives an equal profile.
    assert load_profile_file(profile.source) == profile
    # Hashable and frozen.
    hash(profile)
    with pytest.raises(AttributeError):
        profile.sm_count = 1  # type: ignore[misc]


def test_datasheet_figures():
    h100, h200, a100, l4 = (load_profile(n) for n in ("h100", "h200", "a100", "l4"))
    assert (h100.compute_capability, h100.nvcc_arch, h100.sm_count) == ((9, 0), "sm_90a", 132)
    assert h100.smem_per_block_optin == 232448 and h100.smem_per_sm == 233472
    assert h200.nvcc_arch == "sm_90a" and h200.mem_bandwidth_gbs > h100.mem_bandwidth_gbs
    assert (a100.compute_capability, a100.nvcc_arch, a100.sm_count) == ((8, 0), "sm_80", 108)
    assert (l4.compute_capability, l4.nvcc_arch, l4.sm_count) == ((8, 9), "sm_89", 58)
    assert l4.max_threads_per_sm == 1536
    assert h100.peak_tflops("bf16") == h100.peak_bf16_tflops
    assert h100.peak_tflops("e4m3") == h200.peak_tflops("e4m3") == pytest.approx(2 * h100.peak_bf16_tflops, rel=1e-3)
    assert l4.peak_tflops("e4m3") == pytest.approx(2 * l4.peak_bf16_tflops, rel=1e-2)  # FP8 runs twice as fast
    with pytest.raises(TunerError, match=r"^GPU profile 'a100' gives no FP8 peak \(peak_fp8_tflops"):
        a100.peak_tflops("e4m3")  # Ampere has no FP8 tensor cores
    with pytest.raises(TunerError):
        h100.peak_tflops("fp8")


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H100-SXM5-80GB", "h100"),
        ("nvidia h100 nvl", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", None),
        ("NVIDIA L40", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_match_identifies_exactly_one_card(device_name, expected):
    matching = [p.name for p in list_profiles() if p.matches(device_name)]
    assert matching == ([expected] if expected else [])


def test_to_dict_round_trips_through_validation():
    for profile in list_profiles():
        data = profile.to_dict()
        json.dumps(data)
        assert profile_from_dict(data) == profile


# ----------------------------------------------------------------- validation

SCALAR_FIELDS = [k for k in REQUIRED_KEYS if k != "problems"]


@pytest.mark.parametrize("field", REQUIRED_KEYS)
def test_missing_field_is_rejected_naming_file_and_field(tmp_path, field):
    data = _raw("h100")
    del data[field]
    path = tmp_path / "broken.toml"
    path.write_text(_dump_toml(data))
    with pytest.raises(TunerError) as info:
        load_profile_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"'{field}'" in message
    assert "missing" in message


# A value of the wrong TOML type for each field.
WRONG_TYPES = {
    "name": 100,
    "display_name": ["H100"],
    "match": "H100",
    "compute_capability": "9.0",
    "nvcc_arch": 90,
    "sm_count": "132",
    "smem_per_block_optin": 232448.5,
    "smem_per_sm": True,
    "regs_per_sm": [65536],
    "regs_per_thread": "255",
    "max_threads_per_block": 1024.0,
    "max_threads_per_sm": False,
    "l2_bytes": "50MB",
    "peak_fp16_tflops": "989",
    "peak_bf16_tflops": True,
    "mem_bandwidth_gbs": [3350],
    "problems": {"batch": 1},
}


def test_wrong_types_cover_every_field():
    assert set(WRONG_TYPES) == set(REQUIRED_KEYS)


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_wrong_typed_field_is_rejected_naming_file_and_field(tmp_path, field):
    data = _raw("a100")
    data[field] = WRONG_TYPES[field]
    path = tmp_path / "a100-bad.toml"
    path.write_text(_dump_toml(data))
    with pytest.raises(TunerError) as info:
        load_profile_file(path)
    assert str(path) in str(info.value)
    assert f"'{field}'" in str(info.value)


_toml_values = st.one_of(
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 20), max_size=3),
    st.lists(st.text(max_size=4), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(SCALAR_FIELDS), value=_toml_values, source=st.sampled_from(SHIPPED))
def test_any_mutation_is_accepted_only_if_valid(field, value, source):
    """Replacing one field by an arbitrary value either validates or names that field."""
    data = copy.deepcopy(_raw(source))
    data[field] = value
    try:
        profile = profile_from_dict(data, f"{source}-mutated.toml")
    except TunerError as exc:
        message = str(exc)
        assert f"{source}-mutated.toml" in message
        # the mutated field, or one it is checked against
        related = {
            "compute_capability": ("compute_capability", "nvcc_arch"),
            "smem_per_sm": ("smem_per_sm", "smem_per_block_optin"),
            "max_threads_per_sm": ("max_threads_per_sm", "max_threads_per_block"),
            "regs_per_sm": ("regs_per_sm", "regs_per_thread"),
        }.get(field, (field,))
        assert any(f"'{name}" in message for name in related), message
    else:
        got = getattr(profile, field)
        if field == "compute_capability":
            assert got == tuple(value)
        elif field == "match":
            assert got == tuple(value) and value
        elif isinstance(got, float):
            assert got == float(value) and not isinstance(value, bool) and got > 0
        else:
            assert got == value and not isinstance(value, bool)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch", "16", "problems[0].batch"),
        ("head_dim", 0, "problems[0].head_dim"),
        ("causal", 1, "problems[0].causal"),
        ("dtype", "fp8", "unsupported dtype"),
        ("heads_kv", 3, "multiple of heads_kv"),
        ("seqlen", 5, "problems[0].seqlen"),
    ],
)
def test_bad_problem_is_rejected(key, value, expected):
    data = _raw("h100")
    data["problems"][0][key] = value
    with pytest.raises(TunerError, match=r"h100\.toml") as info:
        profile_from_dict(data, "h100.toml")
    assert expected in str(info.value)


def test_missing_problem_key_is_rejected():
    data = _raw("h100")
    del data["problems"][1]["seq_k"]
    with pytest.raises(TunerError, match=r"'problems\[1\]\.seq_k' is missing"):
        profile_from_dict(data, "h100.toml")


def test_cross_field_checks():
    data = _raw("h100")
    data["nvcc_arch"] = "sm_80"
    with pytest.raises(TunerError, match="nvcc_arch"):
        profile_from_dict(data)
    data = _raw("h100")
    data["smem_per_block_optin"] = data["smem_per_sm"] + 1
    with pytest.raises(TunerError, match="smem_per_block_optin"):
        profile_from_dict(data)


def test_unknown_tables_are_kept_as_extra():
    data = _raw("l4")
    data["space"] = {"block_m": [64, 128]}
    profile = profile_from_dict(data)
    assert profile.extra["space"] == {"block_m": [64, 128]}
    assert profile == load_profile("l4")


def test_unreadable_files(tmp_path):
    with pytest.raises(TunerError, match="file not found"):
        load_profile_file(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(TunerError, match=r"bad\.toml: invalid TOML"):
        load_profile_file(bad)


def test_unknown_profile_name_lists_known():
    with pytest.raises(TunerError) as info:
        load_profile("x")
    assert str(info.value) == "unknown GPU profile 'x'; known: a100, h100, h200, l4"
    with pytest.raises(TunerError, match="known: a100, h100, h200, l4"):
        resolve_profile("b200", detected=None)


def test_profile_name_is_case_insensitive():
    assert load_profile("H100").name == "h100"


# ------------------------------------------------------------------- resolve


def test_auto_picks_matching_profile():
    assert resolve_profile("auto", detected=H100).name == "h100"
    assert resolve_profile("auto", detected=H200).name == "h200"
    assert resolve_profile("AUTO", detected=A100).name == "a100"
    assert resolve_profile("auto", detected=L4).name == "l4"


def test_offline_commands_take_auto_on_a_gpu_host_and_a_named_profile_on_any_host():
    """`tuner export --gpu auto` on the card that searched (session 25 found it refused 'auto')."""
    assert offline_profile("auto", detected=H200).name == "h200"
    assert offline_profile("h100", detected=H200).name == "h100"  # exports are often built on another host
    assert offline_profile("l4", detected=None).name == "l4"
    with pytest.raises(NoGpuError):
        offline_profile("auto", detected=None)


def test_auto_without_gpu_is_no_gpu_error():
    with pytest.raises(NoGpuError) as info:
        resolve_profile("auto", detected=None)
    message = str(info.value)
    assert "\n" not in message
    assert "no CUDA GPU" in message and "--gpu" in message


@pytest.mark.parametrize("gpu", [L40S, GH200])
def test_auto_with_unknown_card_fails(gpu):
    with pytest.raises(TunerError, match="no GPU profile matches") as info:
        resolve_profile("auto", detected=gpu)
    assert gpu.name in str(info.value)
    assert not isinstance(info.value, NoGpuError)


def test_auto_requires_matching_compute_capability():
    odd = DetectedGpu(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(8, 0), sm_count=132)
    with pytest.raises(TunerError, match="no GPU profile matches"):
        resolve_profile("auto", detected=odd)


def test_named_profile_on_matching_gpu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_profile("h100", detected=H100).name == "h100"


def test_named_profile_without_gpu_is_returned_as_is():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_profile("l4", detected=None) == load_profile("l4")


@pytest.mark.parametrize(("name", "gpu"), [("h100", H200), ("h200", H100), ("a100", H100), ("l4", L40S)])
def test_named_profile_on_other_gpu_is_an_error(name, gpu):
    with pytest.raises(TunerError) as info:
        resolve_profile(name, detected=gpu)
    message = str(info.value)
    assert f"'{name}' does not match" in message and gpu.name in message and "--force" in message


def test_force_turns_mismatch_into_warning():
    with pytest.warns(UserWarning, match="does not match"):
        profile = resolve_profile("a100", force=True, detected=H100)
    assert profile.name == "a100"


def test_sm_count_difference_only_warns():
    with pytest.warns(UserWarning, match="114 SMs"):
        assert resolve_profile("h100", detected=H100_PCIE).name == "h100"
    with pytest.warns(UserWarning, match="114 SMs"):
        assert resolve_profile("auto", detected=H100_PCIE).name == "h100"


def test_real_detection_on_this_machine():
    """detect_gpu agrees with torch; resolve without `detected` uses it."""
    torch = pytest.importorskip("torch")
    from tuner.profiles import detect_gpu

    gpu = detect_gpu()
    if not torch.cuda.is_available():
        assert gpu is None
        assert resolve_profile("h100").name == "h100"
        with pytest.raises(NoGpuError):
            resolve_profile("auto")
    else:  # pragma: no cover - GPU machines
        assert gpu is not None and gpu.name == torch.cuda.get_device_name(0)


def test_detect_gpu_with_fake_torch(monkeypatch):
    """detect_gpu reads name, capability, SMs and uuid from torch.cuda."""
    import types

    import torch

    props = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, total_memory=150 * 2**30, uuid="abc-123"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    from tuner.profiles import detect_gpu

    gpu = detect_gpu(0)
    assert gpu == DetectedGpu(0, "NVIDIA H200", (9, 0), 132, 150 * 2**30, "abc-123")
    assert resolve_profile("auto").name == "h200"
    with pytest.raises(TunerError, match="device 3 does not exist"):
        detect_gpu(3)


# ------------------------------------------------------------------------ CLI


def test_cli_profiles_table():
    result = CliRunner().invoke(build_app(), ["profiles"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in SHIPPED:
        assert name in result.output
    assert "sm_90a" in result.output and "NVIDIA H100 SXM5 80GB" in result.output
    assert "227 KiB" in result.output and "50 MiB" in result.output


def test_cli_profiles_json():
    result = CliRunner().invoke(build_app(), ["profiles", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [d["name"] for d in data] == SHIPPED
    h100 = data[1]
    assert h100["compute_capability"] == [9, 0]
    assert h100["smem_per_block_optin"] == 232448
    assert len(h100["problems"]) == len(load_profile("h100").default_problems)


def test_cli_profiles_rejects_unknown_format():
    result = CliRunner().invoke(build_app(), ["profiles", "--format", "xml"])
    assert result.exit_code != 0


def test_shipped_files_have_source_comments():
    for path in sorted(Path(asset_dir("profiles")).glob("*.toml")):
        text = path.read_text()
        assert "datasheet" in text.lower(), f"{path.name} does not say where its figures come from"


class _FakeLibcuda:
    """The few driver calls cuda_query makes, answering for two H100s (a CUDA error once `fail` is set)."""

    fail = 0

    def cuInit(self, flags):
        return self.fail

    def cuGetErrorName(self, result, name):
        name._obj.value = b"CUDA_ERROR_NO_DEVICE"
        return 0

    def cuDeviceGetCount(self, count):
        count._obj.value = 2
        return 0

    def cuDeviceGet(self, handle, index):
        handle._obj.value = index
        return 0

    def cuDeviceGetName(self, buffer, size, handle):
        buffer.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def cuDeviceGetAttribute(self, value, which, handle):
        value._obj.value = {16: 132, 75: 9, 76: 0}[which]
        return 0

    def cuDeviceTotalMem_v2(self, memory, handle):
        memory._obj.value = 80 << 30
        return 0

    def cuDeviceGetUuid(self, raw, handle):
        for i in range(16):
            raw[i] = 16 * handle.value + i
        return 0


def test_the_gpu_is_asked_of_the_cuda_driver_without_torch(monkeypatch):
    """detect_gpu, visible_gpu_count and --gpu auto read the driver (no torch import, no context)."""
    from tuner.profiles import detect_gpu, resolve_profile, visible_gpu_count
    from tuner.runtime.shipped import cuda_driver

    lib = _FakeLibcuda()
    monkeypatch.setattr(cuda_driver, "libcuda", lambda: lib)  # the one door: the query opens the driver there
    gpu = detect_gpu(1)
    assert (gpu.name, gpu.compute_capability, gpu.sm_count, gpu.total_memory_bytes) == \
        ("NVIDIA H100 80GB HBM3", (9, 0), 132, 80 << 30)
    assert gpu.uuid == "10111213-1415-1617-1819-1a1b1c1d1e1f" and visible_gpu_count() == 2
    assert resolve_profile("auto", device=1).name == "h100"
    with pytest.raises(TunerError, match="CUDA device 2 does not exist; this machine has 2"):
        detect_gpu(2)
    lib.fail = 100  # CUDA_ERROR_NO_DEVICE: a driver, no usable GPU
    assert detect_gpu(0) is None and visible_gpu_count() == 0


def test_the_device_query_names_a_failed_call_through_the_drivers_door(monkeypatch):
    """cuda_query's errors are the door's: the call, the driver's error name and its code."""
    from tuner.profiles import cuda_query
    from tuner.runtime.shipped import cuda_driver

    lib = _FakeLibcuda()
    lib.fail = 100
    monkeypatch.setattr(cuda_driver, "libcuda", lambda: lib)
    with pytest.raises(cuda_query.DriverError, match=r"cuInit failed: CUDA_ERROR_NO_DEVICE \(100\)"):
        cuda_query.driver_devices()

    def no_library():
        raise cuda_driver.GpuUnavailableError("cannot open the CUDA driver library libcuda.so.1")

    monkeypatch.setattr(cuda_driver, "libcuda", no_library)
    assert cuda_query.driver_devices() is None  # no driver library: torch.cuda is asked instead


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_default_problems_cover_every_combination_the_hopper_template_takes(name) -> None:
    """`tuner search` with no --shape tunes every (head dim, dtype, causal) attn_fwd_wgmma supports, so an
    export of the defaults has a tuned kernel for each (D64 causal included)."""
    from tuner.kernels.manifest import load_manifest

    feats = load_manifest("attn_fwd_wgmma").features
    wanted = {(d, dt, c) for d in feats.head_dims for dt in feats.dtypes for c in (False, True)}
    have = {(p.head_dim, p.dtype, p.causal) for p in load_profile(name).default_problems}
    assert wanted <= have, sorted(wanted - have)
