"""FlashCore tuner: autotuning and profiling of fused attention kernels."""

def __getattr__(name: str) -> str:
    # __version__ is read on first use: importlib.metadata costs ~40 ms at every start of `tuner`, before
    # the entry point can install its signal handlers (tuner.stop_signals).
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("flashcore-tuner")
        except PackageNotFoundError:  # running from a checkout without install
            found = "0.1.0"
        globals()["__version__"] = found
        return found
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
