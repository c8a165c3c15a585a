"""A stand-in for FlashAttention-4's `flash_attn.cute` module, for the baseline tests run without a GPU."""

from __future__ import annotations

import sys
import types
from typing import Callable

from tuner.runtime.baselines import FA4_CACHE_DIR_ENV, FA4_CACHE_ENABLED_ENV


def install_fake_fa4(monkeypatch, flash_attn_func: Callable) -> None:
    """Make `from flash_attn.cute import flash_attn_func` give `flash_attn_func` for one test, with FA4's
    cache variables unset (fa4_baseline sets them)."""
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    package = types.ModuleType("flash_attn")
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    unset_fa4_cache_settings(monkeypatch)


def unset_fa4_cache_settings(monkeypatch) -> None:
    """Both of FA4's cache variables unset for the test, and absent again after it (fa4_baseline sets them)."""
    for name in (FA4_CACHE_ENABLED_ENV, FA4_CACHE_DIR_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
