"""FlashCore tuner: autotuning and profiling of fused attention kernels."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("flashcore-tuner")
except PackageNotFoundError:  # running from a checkout without install
    __version__ = "0.1.0"
