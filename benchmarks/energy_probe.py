"""How NVML's power and energy readings behave under back-to-back load on this card: the energy counter's
update period, the 'instant' power field against the counter, and what 100 ms windows of each report (the
tuner's timed blocks are ~100 ms). GPU machine; prints a summary and writes $OUT/energy_probe.json.

    python benchmarks/energy_probe.py
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import pynvml
import torch

POLL_S = 0.002


def main() -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    instant_id = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)
    average_id = getattr(pynvml, "NVML_FI_DEV_POWER_AVERAGE", None)
    samples: list[tuple[float, float, float, float | None, float | None]] = []
    halt = threading.Event()

    def field(fid: int | None) -> float | None:
        if fid is None:
            return None
        try:
            v = pynvml.nvmlDeviceGetFieldValues(h, [fid])[0]
            return float(v.value.uiVal) / 1000.0 if v.nvmlReturn == 0 else None
        except Exception:  # noqa: BLE001
            return None

    def poll() -> None:
        while not halt.is_set():
            samples.append((time.perf_counter(), float(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)),
                            pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, field(instant_id), field(average_id)))
            halt.wait(POLL_S)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    t = threading.Thread(target=poll, daemon=True)
    t.start()
    phases = []  # (start, end, kind)
    t_end = time.perf_counter() + 3.0
    while time.perf_counter() < t_end:  # steady: back-to-back GEMMs
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
    phases.append(("steady", t_end - 3.0, time.perf_counter()))
    for i in range(10):  # alternating 150 ms heavy / 150 ms light
        s0 = time.perf_counter()
        heavy = i % 2 == 0
        while time.perf_counter() < s0 + 0.15:
            for _ in range(5):
                (a @ b) if heavy else (small @ small)
            torch.cuda.synchronize()
        phases.append(("heavy" if heavy else "light", s0, time.perf_counter()))
    halt.set()
    t.join()

    times = [s[0] for s in samples]
    changes = [(s[0], s[1]) for i, s in enumerate(samples) if i == 0 or s[1] != samples[i - 1][1]]
    periods = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    _, s0, s1 = phases[0]
    inside = [c for c in changes if s0 <= c[0] <= s1]
    truth = (inside[-1][1] - inside[0][1]) / 1000.0 / (inside[-1][0] - inside[0][0])
    report = {"gpu": torch.cuda.get_device_name(0), "samples": len(samples), "counter_changes": len(changes),
              "update_period_ms": [round(1000 * x, 1) for x in (min(periods), statistics.median(periods), max(periods))],
              "steady_power_counter_3s_w": round(truth, 1)}
    steady = [s for s in samples if s0 <= s[0] <= s1]
    report["steady_mean_powerusage_w"] = round(statistics.fmean(s[2] for s in steady), 1)
    if steady[0][3] is not None:
        report["steady_mean_instant_w"] = round(statistics.fmean(s[3] for s in steady), 1)
        report["instant_distinct_values_per_s"] = round(
            sum(1 for i in range(1, len(steady)) if steady[i][3] != steady[i - 1][3]) / (s1 - s0), 1)
    if steady[0][4] is not None:
        report["steady_mean_average_field_w"] = round(statistics.fmean(s[4] for s in steady), 1)
    # 100 ms windows inside the steady phase: naive counter delta, slope between change points, instant mean.
    naive, slope, inst = [], [], []
    w0 = s0 + 0.2
    while w0 + 0.1 < s1:
        w1 = w0 + 0.1
        first = max((s for s in samples if s[0] <= w0), key=lambda s: s[0])
        last = max((s for s in samples if s[0] <= w1), key=lambda s: s[0])
        naive.append((last[1] - first[1]) / 1000.0 / 0.1)
        cin = [c for c in changes if w0 <= c[0] <= w1]
        if len(cin) >= 2:
            slope.append((cin[-1][1] - cin[0][1]) / 1000.0 / (cin[-1][0] - cin[0][0]))
        win = [s[3] for s in samples if w0 <= s[0] <= w1 and s[3] is not None]
        if win:
            inst.append(statistics.fmean(win))
        w0 = w1
    for name, xs in (("window100_naive_w", naive), ("window100_slope_w", slope), ("window100_instant_w", inst)):
        if xs:
            report[name] = [round(min(xs)), round(statistics.median(xs)), round(max(xs)), len(xs)]
    report["phases"] = []
    for kind, p0, p1 in phases[1:]:
        win = [s for s in samples if p0 + 0.05 <= s[0] <= p1]
        report["phases"].append([kind, round(statistics.fmean(s[2] for s in win)),
                                 round(statistics.fmean(s[3] for s in win)) if win[0][3] is not None else None])
    print(json.dumps(report, indent=1))
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "energy_probe.json"), "w") as f:
        json.dump({"report": report, "samples": samples[:5000]}, f)


if __name__ == "__main__":
    main()
