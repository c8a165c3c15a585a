"""TMA tensor maps without a GPU: one map per input layout, each call's address written into it.

Encoding a map is a driver call (about 9 us from Python, three per launch), so
the launcher keeps the address-free part of each layout's maps and writes the
call's addresses into their first 8 bytes. That is only right where the driver
lays maps out that way; the encoder checks it per layout, with the driver
itself, and the launcher falls back to encoding every call where it does not
hold. A fake cuTensorMapEncodeTiled stands in for the driver here.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from tuner.runtime.shipped.launcher import TMA_ARG_FORMAT, TensorMapEncoder


def fake_driver(address_at: int):
    """A cuTensorMapEncodeTiled that writes the address at byte `address_at` and the layout elsewhere."""

    def encode(out, _dtype, _rank, address, dims, strides, box, _elem, *_modes) -> int:
        body = bytearray(128)
        layout = [*dims, *strides[:3], *box]
        for i, value in enumerate(layout):
            body[16 + 4 * i:20 + 4 * i] = (value % 2**32).to_bytes(4, "little")
        body[address_at:address_at + 8] = address.value.to_bytes(8, "little")
        ctypes.memmove(out.value, bytes(body), 128)
        return 0

    return encode


def encoder_with(driver) -> TensorMapEncoder:
    enc = object.__new__(TensorMapEncoder)
    enc._fn, enc._ctypes = driver, ctypes
    return enc


def test_the_address_free_map_is_the_map_at_any_address() -> None:
    enc = encoder_with(fake_driver(address_at=0))
    t = torch.zeros(2, 4, 100, 64, dtype=torch.float16)
    tail = enc.address_free("q", t, 64, 128)
    assert tail is not None and len(tail) == 120
    for address in (0x7F00_0000_0000, 0x7F12_3456_7890):
        full = enc.encode("q", t, 64, 128, address)
        assert full == address.to_bytes(8, "little") + tail
    other = enc.address_free("q", torch.zeros(2, 4, 101, 64, dtype=torch.float16), 64, 128)
    assert other != tail  # another layout, another map


def test_a_driver_that_keeps_the_address_elsewhere_gets_no_address_free_map() -> None:
    enc = encoder_with(fake_driver(address_at=8))
    assert enc.address_free("k", torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16), 128, 128) is None


def test_the_kernel_argument_format_splits_each_map_into_address_and_rest() -> None:
    import struct

    maps = (b"A" * 120, b"B" * 120, b"C" * 120)
    rest = (1, 2, 3, 4, 0, *range(12), 16, 16, 1, 0.5, 4, 2)
    packed = struct.pack("=" + TMA_ARG_FORMAT.replace("P", "Q"),
                         0x1000, maps[0], 0x2000, maps[1], 0x3000, maps[2], *rest)
    for i, (address, tail) in enumerate(zip((0x1000, 0x2000, 0x3000), maps)):
        assert packed[128 * i:128 * (i + 1)] == address.to_bytes(8, "little") + tail


def test_bad_strides_are_a_clear_error() -> None:
    from tuner.runtime.shipped.launcher import AttentionInputError

    def refusing(*_args) -> int:
        return 1  # CUDA_ERROR_INVALID_VALUE

    enc = encoder_with(refusing)
    with pytest.raises(AttentionInputError, match="TMA cannot address this tensor"):
        enc.address_free("v", torch.zeros(1, 1, 8, 64, dtype=torch.float16), 64, 128)
