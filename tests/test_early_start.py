"""A search's GPU children started from the command line before the CLI's imports (tuner.early_start)."""

from __future__ import annotations

import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.early_start import search_devices


@pytest.mark.parametrize("argv, devices", [
    (["search", "--gpu", "h100"], (0,)),
    (["--db", "sqlite:///x.db", "search", "--devices", "0,1"], (0, 1)),
    (["--db=sqlite:///x.db", "search", "--devices=2,3,1"], (2, 3, 1)),
    (["search", "--backend", "replay", "--from", "x"], None),
    (["search", "--backend=replay"], None),
    (["search", "--devices", "0,0"], None),  # the CLI refuses it: start nothing
    (["search", "--devices", "0", "--devices", "0,1"], (0, 1)),  # the last one, as the CLI takes it
    (["search", "--backend", "GPU"], (0,)),
    (["search", "--devices", "a"], None),
    (["search", "--help"], None),
    (["results", "--study", "search"], None),
    (["--db", "search"], None),  # "search" is the store's URL here: no command at all
    ([], None),
])
def test_the_search_devices_are_read_from_the_command_line(argv, devices):
    assert search_devices(argv) == devices


@given(devices=st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True))
def test_devices_written_as_the_cli_takes_them_are_read_back(devices):
    text = ",".join(map(str, devices))
    assert search_devices(["search", "--gpu", "auto", "--devices", text, "--trials", "5"]) == tuple(devices)


def test_worker_processes_started_early_are_adopted_once_and_the_others_end(monkeypatch):
    from tuner.search import worker_entry
    from tuner.search.worker_processes import started_workers

    monkeypatch.setattr(worker_entry, "_early", None)
    worker_entry.start_early((0, 1), gpu=False)
    early = worker_entry._early
    with started_workers((0, 1), False) as adopted:
        assert adopted is early and worker_entry._early is None
    assert not any(p.is_alive() for p in early.procs)  # never given work: ended on the way out
    worker_entry.start_early((0, 1), gpu=False)
    wrong = worker_entry._early
    with started_workers((0, 2), False) as fresh:  # other devices: the early ones end, new ones start
        assert fresh is not wrong and fresh.devices == (0, 2)
        assert not any(p.is_alive() for p in wrong.procs)


def test_a_worker_process_whose_parent_dies_ends_instead_of_waiting_forever(tmp_path):
    import subprocess

    script = tmp_path / "parent.py"
    script.write_text(
        "import os\n"
        "from tuner.search.worker_entry import StartedWorkers\n"
        "if __name__ == '__main__':  # spawned children re-run this script\n"
        "    started = StartedWorkers((0, 1), gpu=False)\n"
        "    print(' '.join(str(p.pid) for p in started.procs), flush=True)\n"
        "    os._exit(0)  # no atexit, no discard: as if killed\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    deadline = time.monotonic() + 30
    import os

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_a_command_that_fails_after_the_early_start_exits_at_once_and_ends_its_workers(tmp_path):
    """`tuner search --devices 0,1 ...` whose options the CLI then refuses: the worker processes started
    from argv are ended on the way out (not joined forever: they would wait for a spec)."""
    import os
    import subprocess

    script = tmp_path / "entry.py"
    script.write_text(
        "import sys\n"
        "from tuner.search import worker_entry\n"
        "if __name__ == '__main__':  # spawned children re-run this script\n"
        "    worker_entry.start_early((0, 1), gpu=True)\n"
        "    print(' '.join(str(p.pid) for p in worker_entry._early.procs), flush=True)\n"
        "    sys.exit(2)  # as the CLI does on a bad option\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and time.monotonic() - started < 30, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    for pid in map(int, out.stdout.split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_worker_process_that_died_before_its_spec_is_reported_not_a_broken_pipe(replay_recording, sqlite_url):
    import io

    from rich.console import Console

    from tuner.errors import TunerError
    from tuner.search.job import WorkerJob
    from tuner.search.progress import SearchProgress
    from tuner.search.worker_entry import StartedWorkers
    from tuner.search.worker_processes import run_processes
    from tuner.search.workers import WorkerSpec

    started = StartedWorkers((0, 1), gpu=False)
    started.procs[1].kill()  # e.g. the OOM killer, before the parent had prepared the studies
    started.procs[1].join(10)
    jobs = (WorkerJob(0, "no-such-study", 5),)
    specs = [WorkerSpec(w, w, sqlite_url, sqlite_url, "replay", jobs, replay_recording.url, local_workers=2)
             for w in (0, 1)]
    begun = time.monotonic()
    with SearchProgress(Console(file=io.StringIO()), enabled=False) as progress:
        with pytest.raises(TunerError):
            run_processes(specs, progress, lambda text: None, started)
    started.end(5)
    assert not any(p.is_alive() for p in started.procs) and time.monotonic() - begun < 60
