"""What `tuner results`, `show`, `report`, `export` and `db` say (issue 36: replayed trials, damaged
journals, downgrades, 80 columns)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from cli_helpers import run_tuner
from store_factories import H200, trial

from tuner.store import RunInfo, open_store, redact_url

RECORDING = "sqlite:////recordings/grid.db"


def _store(tmp_path, *, replayed: bool) -> str:
    """A store holding trial 1 of run 1, replayed from RECORDING or measured."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    info = RunInfo(gpu_name=H200.gpu_name, profile=H200.profile, replayed_from=RECORDING if replayed else None)
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(info)))
    return url


def test_show_says_a_trial_was_replayed_as_results_marks_it(tmp_path) -> None:
    replayed = run_tuner("show", "1", "--db", _store(tmp_path, replayed=True), env={"COLUMNS": "80"})
    assert replayed.exit_code == 0, replayed.stderr
    assert f"replayed: from {RECORDING} (--backend replay): answered from a" in replayed.stdout
    measured = run_tuner("show", "1", "--db", _store(tmp_path / "m", replayed=False), env={"COLUMNS": "80"})
    assert measured.exit_code == 0, measured.stderr
    assert "replayed" not in measured.stdout


def test_show_wraps_its_long_lines_to_80_columns_at_spaces(tmp_path) -> None:
    """params, template (its 64-hex hash) and replayed lines wrap at spaces, continuation lines indented;
    nothing is lost (issue 36, item 13)."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    params = {f"TUNABLE_NUMBER_{i}": 1000 + i for i in range(12)}
    info = RunInfo(gpu_name=H200.gpu_name, profile=H200.profile, replayed_from="sqlite:///" + "r" * 60 + ".db")
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(info), params=params, template_hash="c0ffee" * 10 + "abcd"))
    result = run_tuner("show", "1", "--db", url, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    params_at = next(i for i, line in enumerate(lines) if line.startswith("params: "))
    assert lines[params_at + 1].startswith("  TUNABLE_NUMBER_")  # a continuation, indented
    flat = " ".join(line.strip() for line in lines)
    assert ", ".join(f"{k}={v}" for k, v in sorted(params.items())) in flat  # every value whole
    assert "template: attn_fwd_mma @ " + "c0ffee" * 10 + "abcd" in flat
    assert f"replayed: from {info.replayed_from} (--backend replay)" in flat


def test_the_search_summary_lines_wrap_to_80_columns_between_phrases(replay_recording, tmp_path) -> None:
    """The `measured ...` (157 columns) and `time: ...` (200) lines wrap between their phrases: a figure
    keeps its unit, a study name stays whole after "studies" (issue 36, item 13)."""
    p = replay_recording.problem
    result = run_tuner("--db", f"sqlite:///{tmp_path / 'r.db'}", "search", "--gpu", replay_recording.profile,
                       "--shape", f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}", "--backend", "replay",
                       "--from", replay_recording.url, "--trials", "20", "--seed", "1", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith("measured 20 trials"))
    timing = next(i for i, line in enumerate(lines) if line.startswith("time: "))
    assert timing > start + 1 and len(lines) > timing + 1  # both wrapped
    assert all(line.startswith("  ") for line in lines[start + 1:timing] + lines[timing + 1:])
    counts = " ".join(line.strip() for line in lines[start:timing])
    assert re.search(r"; runs \d+; studies h\w+-attn_\w+-B1H8S512S512D64-fp16$", counts), counts
    times = " ".join(line.strip() for line in lines[timing:])
    assert re.fullmatch(r"time: [\d.]+ s wall; (?:[A-Za-z (),-]+ [\d.]+ s \(\d+%\), )+other [\d.]+ s \(\d+%\)", times), times


def test_results_keep_a_problem_label_on_its_rows_line_at_80_columns(tmp_path) -> None:
    """`B16 H16 S2048 D64 fp16` is not split over two lines: TFLOP/s makes room (issue 36, item 13)."""
    from store_factories import BIG

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        run = store.start_run(H200)
        for m, us in ((64, 9.7), (128, 11.2)):
            store.add_trial(trial(run, BIG, params={"BLOCK_M": m}, median_us=us,
                                  variant_name=f"attn_fwd_mma_d64_fp16_m{m}n128_w4_q_rows_xor_s3_qsmem_b2_lr"))
    result = run_tuner("results", "--db", url, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines if not line.startswith("store: ")) <= 80
    rows = [line for line in lines if re.match(r"^\s*\d+ ", line)]
    assert len(rows) == 2 and all(f" {BIG.label} m" in row for row in rows), result.stdout


# --- a damaged Optuna journal ---------------------------------------------------------------------


def _journal_store(tmp_path) -> tuple[str, Path]:
    """A store with trial 1 (h200) and 2,000 journal records of about 100 bytes (many pages)."""
    path = tmp_path / "j.db"
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(H200)))
        store.append_journal([json.dumps({"op_code": 4, "worker_id": "w", "n": n, "pad": "x" * 60},
                                         separators=(",", ":")) for n in range(2000)])
    return url, path


def _damage(path: Path, marker: bytes, offset: int, data: bytes) -> None:
    """Write `data` at `offset` from the page start (offset >= 0) or from `marker` (offset < 0)."""
    raw = path.read_bytes()
    at = raw.index(marker)  # the store is closed: its WAL was checkpointed into the file
    at = (at // 4096) * 4096 + offset if offset >= 0 else at - offset - 1
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(data)


def _commands(url: str, tmp_path) -> dict[str, object]:
    return {"results": run_tuner("results", "--db", url), "show": run_tuner("show", "1", "--db", url),
            "report": run_tuner("report", "--gpu", "h200", "--db", url, "--out", str(tmp_path / "report")),
            "export": run_tuner("export", "--gpu", "h200", "--db", url, "--out", str(tmp_path / "pkg"))}


def test_results_show_report_and_export_say_a_damaged_journal_page_in_one_line(tmp_path) -> None:
    """Random bytes over a journal page's b-tree header (issue 36, item 8): each command names the pages."""
    url, path = _journal_store(tmp_path)
    _damage(path, b'"n":1000,', 0, random.Random(36).randbytes(120))
    for name, result in _commands(url, tmp_path).items():
        warning = next((line for line in result.stderr.splitlines() if "journal" in line), "")
        # SQLite's check names the pages, or gives up on them: then the last record read says where
        assert re.fullmatch(rf"warning: the Optuna journal in {re.escape(url)} is damaged \((SQLite pages? [\d, ]+ "
                            r"of its table fail SQLite's check|SQLite cannot read it after record \d+: .+)\): "
                            r"its studies cannot be continued .*", warning), (name, result.stderr)
    assert _commands(url, tmp_path)["results"].exit_code == 0  # the trials themselves still read


def test_a_damaged_journal_record_is_named_and_an_intact_journal_says_nothing(tmp_path) -> None:
    url, path = _journal_store(tmp_path)
    clean = run_tuner("results", "--db", url)
    assert clean.exit_code == 0 and clean.stderr == ""
    _damage(path, b'"n":777,', -3, b"\xff")  # one byte inside record 778: no longer ASCII JSON
    for name in ("results", "show"):
        result = _commands(url, tmp_path)[name]
        assert "is damaged (record 778 is not the JSON the search wrote)" in result.stderr, (name, result.stderr)
        assert result.stderr.count("\n") == 1


# --- tuner db downgrade ---------------------------------------------------------------------------


def _revision(url: str) -> str | None:
    from tuner.store import store_info

    return store_info(url).revision


def test_db_downgrade_refuses_to_delete_data_in_one_line_and_changes_nothing(store_url) -> None:
    """As the API (tuner.store.downgrade) refuses: naming what would go, exit 2, the store as it was."""
    from tuner.store import NcuMetric
    from tuner.store.engine import head_revision

    with open_store(store_url) as store:
        store.add_ncu_metrics(store.add_trial(trial(store.start_run(H200))), [NcuMetric("dram__throughput", 1.5)])
    result = run_tuner("db", "downgrade", "0001", "--db", store_url)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == ("error: the results store cannot go back to revision 0001: that would delete "
                             "ncu metrics (1); nothing was changed\n")
    assert _revision(store_url) == head_revision()
    assert run_tuner("results", "--db", store_url).exit_code == 0


def test_db_downgrade_goes_down_where_nothing_is_lost_and_upgrade_comes_back(store_url) -> None:
    from tuner.store.engine import head_revision

    assert run_tuner("db", "upgrade", "--db", store_url).exit_code == 0
    down = run_tuner("db", "downgrade", "0004", "--db", store_url)
    assert down.exit_code == 0, down.stderr
    assert down.stdout.startswith(f"downgraded {redact_url(store_url)} from revision {head_revision()} to 0004")
    assert _revision(store_url) == "0004"
    assert "run `tuner db upgrade`" in run_tuner("results", "--db", store_url).stderr  # an older schema is refused
    again = run_tuner("db", "downgrade", "0004", "--db", store_url)
    assert again.exit_code == 0 and "is already at revision 0004" in again.stdout
    assert run_tuner("db", "upgrade", "--db", store_url).exit_code == 0 and _revision(store_url) == head_revision()


def test_db_downgrade_to_an_unknown_or_newer_revision_is_a_one_line_error(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    missing = run_tuner("db", "downgrade", "0004", "--db", url)
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no results store at ")
    assert not (tmp_path / "r.db").exists()
    assert run_tuner("db", "upgrade", "--db", url).exit_code == 0
    assert run_tuner("db", "downgrade", "0003", "--db", url).exit_code == 0
    for target, message in (("0099", "error: unknown schema revision '0099'; known: 0001, "),
                            ("0005", "error: revision 0005 is newer than the store's 0003: run `tuner db upgrade`")):
        result = run_tuner("db", "downgrade", target, "--db", url)
        assert result.exit_code == 2 and result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert _revision(url) == "0003"


def test_alembics_own_cli_refuses_a_losing_downgrade_in_one_line(tmp_path) -> None:
    """`alembic downgrade` (db/env.py, development) says the refusal as one FAILED line, not a traceback."""
    import subprocess
    import sys

    from tuner.store import NcuMetric
    from tuner.store.engine import head_revision, migrations_dir

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        store.add_ncu_metrics(store.add_trial(trial(store.start_run(H200))), [NcuMetric("dram__throughput", 1.5)])
    ini = tmp_path / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {migrations_dir()}\n")
    run = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ini), "-x", f"url={url}", "downgrade", "0001"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stdout + run.stderr
    assert (run.stdout + run.stderr).strip().splitlines() == ["FAILED: the results store cannot go back to revision 0001: that would "
                                               "delete ncu metrics (1); nothing was changed"]
    assert _revision(url) == head_revision()


def test_a_journal_sqlite_cannot_open_read_only_is_read_through_the_store_instead(tmp_path, monkeypatch) -> None:
    """Where the checker's own read-only connection cannot open the file (a read-only folder, an SQLite
    without json_valid), the journal is read as Optuna reads it: an intact one raises no false alarm."""
    import sqlite3

    from tuner.cli import journal_check

    def cannot_open(path: str) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    url, path = _journal_store(tmp_path)
    monkeypatch.setattr(journal_check, "_sqlite_damage", cannot_open)
    assert run_tuner("results", "--db", url).stderr == ""
    _damage(path, b'"n":777,', -3, b"\xff")
    assert "is damaged (" in run_tuner("results", "--db", url).stderr
