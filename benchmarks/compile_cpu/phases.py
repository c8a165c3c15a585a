"""CPU seconds of one sm_90a cubin compile by phase (gcc -E, cicc, ptxas) and through nvcc, for the same variants
rendered from two checkouts (each with its own nvcc options, as `tuner render` prints them); median of N runs,
interleaved (a shared machine's load drifts), one compile at a time. Also checks that both give the same cubin.

    python benchmarks/compile_cpu/phases.py --before /work/main --after . VARIANT...
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def cpu(cmd: list[str], cwd: str) -> float:
    """User + system seconds of `cmd` and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def render(checkout: str, variant: str, folder: Path) -> tuple[Path, list[str]]:
    """The variant's one-file source from `checkout` and the nvcc command its header names."""
    text = subprocess.run([sys.executable, "-m", "tuner", "render", variant], cwd=checkout, check=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": checkout}).stdout
    src = folder / f"{variant}.cu"
    src.write_text(text)
    return src, shlex.split(re.search(r"^//   (nvcc .*)$", text, re.MULTILINE).group(1))


def phases(nvcc: list[str], folder: str) -> tuple[float, ...]:
    """gcc -E, cicc, ptxas run as `nvcc --dryrun` lists them, then nvcc itself: CPU seconds of each."""
    dry = subprocess.run([*nvcc, "--dryrun", "--keep", "--keep-dir", folder], cwd=folder, capture_output=True,
                         text=True, check=True).stderr
    steps = [line[3:] for line in dry.splitlines() if line.startswith("#$ ") and "=" not in line.split()[1][:20]]
    cicc_dir = str(Path(nvcc_bin()).parent.parent / "nvvm" / "bin")
    times = [cpu(shlex.split(step.replace("$CICC_PATH", cicc_dir)), folder) for step in steps]
    return (*times, cpu(nvcc, folder))


def nvcc_bin() -> str:
    return subprocess.run(["which", "nvcc"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    print("| variant | gcc -E | cicc | ptxas | nvcc (all) | less | same cubin |\n|---|---|---|---|---|---|---|")
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            sides = {}
            for side in ("before", "after"):
                folder = Path(tmp) / side
                folder.mkdir()
                src, cmd = render(os.path.abspath(getattr(args, side)), variant, folder)
                sides[side] = (str(folder), cmd)
            runs: dict[str, list[tuple[float, ...]]] = {"before": [], "after": []}
            for _ in range(args.n):
                for side, (folder, cmd) in sides.items():
                    runs[side].append(phases(cmd, folder))
            med = {s: [statistics.median(x) for x in zip(*r)] for s, r in runs.items()}
            sha = {s: hashlib.sha256(next(Path(f).glob("*.cubin")).read_bytes()).hexdigest() for s, (f, _) in sides.items()}
        b, a = med["before"], med["after"]
        cells = " | ".join(f"{x:.2f} / {y:.2f}" for x, y in zip(b, a))
        print(f"| {variant} | {cells} | {100 * (1 - a[-1] / b[-1]):.0f}% | {sha['before'] == sha['after']} |", flush=True)


if __name__ == "__main__":
    main()
