"""Variants compiled per second by a pool of N threads (as a search's compile pool: nvcc in subprocesses), with a
fresh cache, using the checkout on sys.path: run it once per revision on the same host to compare throughput.

    PYTHONPATH=/path/to/checkout python benchmarks/compile_cpu/pool_throughput.py --threads 16 VARIANT ...
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    os.environ["TUNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="pool_cache_")  # nothing cached: every variant compiles
    from tuner.kernels.variant import parse_variant_name
    from tuner.runtime.build import build

    def one(name: str) -> bool:
        return build(parse_variant_name(name), args.arch).ok

    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        ok = list(pool.map(one, args.variants))
    wall = time.perf_counter() - start
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = kids.ru_utime + kids.ru_stime
    print(f"{len(ok)} variants ({sum(ok)} ok), {args.threads} threads: {wall:.1f} s wall, "
          f"{len(ok) / wall:.2f} variants/s, {cpu / len(ok):.2f} CPU-s per compile (nvcc and its children)")


if __name__ == "__main__":
    main()
