"""`tuner results`, `tuner show` and `tuner db`: output formats, filters and one-line errors."""

from __future__ import annotations

import csv
import io
import json

import pytest
from cli_helpers import run_tuner
from store_factories import BIG, H100, H200, SMALL, baseline, trial

from tuner.problem import Problem
from tuner.store import NcuMetric, open_store

NO_ENV = {"TUNER_DB": None}
SECRET = "s3cr3t-pw"
PG_WITH_PASSWORD = f"postgresql://tuner:{SECRET}@127.0.0.1:1/tuner"


def tuner(url: str, *args: str):
    return run_tuner("--db", url, *args, env=NO_ENV)


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def filled(sqlite_url):
    """A store with two GPUs, two problems, failures, baselines and ncu metrics."""
    with open_store(sqlite_url) as store:
        h100, h200 = store.start_run(H100), store.start_run(H200)
        ids = {
            "slow": store.add_trial(trial(h100, BIG, params={"m": 128}, median_us=90.0)),
            "fast": store.add_trial(trial(h100, BIG, params={"m": 64}, median_us=60.0, p20_us=58.0, p80_us=63.0,
                                          compile_log="ptxas info [reg] 96", source_path="/tmp/fast.cu")),  # fmt: skip
            "broken": store.add_trial(trial(h100, BIG, params={"m": 32}, status="compile_error", median_us=None,
                                            error="error: [bold]too much smem[/bold]", compile_log="line1\nline2")),  # fmt: skip
            "small": store.add_trial(trial(h100, SMALL, params={"m": 64}, median_us=12.0, template="attn_split_k")),
            "h200": store.add_trial(trial(h200, BIG, params={"m": 64}, median_us=40.0)),
            "bf16": store.add_trial(trial(h200, Problem(16, 16, 2048, 2048, 64, dtype="bf16"), median_us=45.0)),
        }
        store.add_baseline(baseline(h100, BIG, "sdpa_flash", 90.0))
        store.add_baseline(baseline(h100, BIG, "sdpa_cudnn", 75.0))
        store.add_ncu_metrics(ids["fast"], [NcuMetric("sm__throughput.avg.pct_of_peak_sustained_elapsed", 88.5, "%")])
    return sqlite_url, ids


def results_json(url: str, *args: str) -> list[dict]:
    result = tuner(url, "results", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _empty_store(url: str) -> str:
    assert tuner(url, "db", "upgrade").exit_code == 0
    return url


def test_results_empty_json_is_an_empty_list(sqlite_url):
    result = tuner(_empty_store(sqlite_url), "results", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_results_empty_csv_has_a_header(sqlite_url):
    result = tuner(_empty_store(sqlite_url), "results", "--format", "csv")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [result.stdout.splitlines()[0]]
    assert result.stdout.startswith("id,run_id,gpu_name,profile,")


def test_results_filters(filled):
    url, ids = filled

    def got(*args: str) -> set[int]:
        return {row["id"] for row in results_json(url, *args)}

    assert got() == set(ids.values())
    assert got("--gpu", "h100") == {ids["slow"], ids["fast"], ids["broken"], ids["small"]}
    assert got("--gpu", "H200") == {ids["h200"], ids["bf16"]}
    assert got("--shape", "1,8,512,64") == {ids["small"]}
    assert got("--shape", "16,16,2048,2048,64", "--dtype", "fp16") == {ids["slow"], ids["fast"], ids["broken"], ids["h200"]}
    assert got("--dtype", "bf16") == {ids["bf16"]}
    assert got("--causal") == {ids["small"]}
    assert ids["small"] not in got("--no-causal")
    assert got("--template", "attn_split_k") == {ids["small"]}
    assert got("--status", "compile_error") == {ids["broken"]}
    assert len(got("--limit", "2")) == 2


def test_results_best_picks_the_fastest_ok_per_problem_and_gpu(filled):
    url, ids = filled
    rows = results_json(url, "--best")
    assert {row["id"] for row in rows} == {ids["fast"], ids["small"], ids["h200"], ids["bf16"]}
    fast = next(row for row in rows if row["id"] == ids["fast"])
    assert fast["ratio_to_best_baseline"] == pytest.approx(75.0 / 60.0)
    assert fast["best_baseline_impl"] == "sdpa_cudnn"
    assert [row["id"] for row in results_json(url, "--best", "--gpu", "h100", "--shape", "16,16,2048,64")] == [ids["fast"]]


def test_results_csv(filled):
    url, ids = filled
    result = tuner(url, "results", "--format", "csv", "--gpu", "h100")
    assert result.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 4
    fast = next(r for r in rows if r["id"] == str(ids["fast"]))
    assert fast["status"] == "ok" and float(fast["median_us"]) == 60.0 and json.loads(fast["params"]) == {"m": 64}


def test_results_table_states_the_store(filled):
    url, ids = filled
    result = tuner(url, "results", "--best")
    assert result.exit_code == 0, result.stderr
    assert f"store: {url}" in result.stdout
    assert "best trials" in result.stdout and "1.25x" in result.stdout
    empty = tuner(url, "results", "--gpu", "nothing")
    assert "no trials match" in empty.stdout and f"store: {url}" in empty.stdout


def test_help_states_the_store_location():
    result = run_tuner("results", "--help")
    assert result.exit_code == 0
    assert "Results store:" in result.stdout


def test_show_table_and_json(filled):
    url, ids = filled
    result = tuner(url, "show", str(ids["fast"]))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for fragment in ("m=64", BIG.label, "60.00 / 58.00 / 63.00", "1.250x", "sdpa_cudnn", "sdpa_flash",
                     "sm__throughput.avg.pct_of_peak_sustained_elapsed", "88.5", "ptxas info [reg] 96", "/tmp/fast.cu"):  # fmt: skip
        assert fragment in out, fragment
    broken = tuner(url, "show", str(ids["broken"]))
    assert "error: [bold]too much smem[/bold]" in broken.stdout  # user text is not rich markup
    assert "line1\nline2" in broken.stdout
    data = json.loads(tuner(url, "show", str(ids["fast"]), "--format", "json").stdout)
    assert data["id"] == ids["fast"] and data["params"] == {"m": 64}
    assert data["ncu_metrics"][0]["value"] == 88.5 and len(data["baselines"]) == 2
    assert data["ratio_to_best_baseline"] == pytest.approx(1.25) and data["compile_log"] == "ptxas info [reg] 96"


def test_show_unknown_trial(sqlite_url):
    assert_one_line_error(tuner(_empty_store(sqlite_url), "show", "42"), "no trial with id 42")


def test_readers_do_not_create_a_store_named_by_mistake(tmp_path):
    typo = tmp_path / "new-folder" / "reslts.db"
    for args in (("results",), ("show", "1"), ("profile", "1")):
        assert_one_line_error(tuner(f"sqlite:///{typo}", *args), "no results store at", "tuner db upgrade")
    assert not typo.parent.exists()


def test_db_info_and_upgrade(sqlite_url):
    created = tuner(sqlite_url, "db", "upgrade")
    assert created.exit_code == 0 and "from revision none to" in created.stdout
    info = tuner(sqlite_url, "db", "info")
    assert info.exit_code == 0 and sqlite_url in info.stdout and "up to date" in info.stdout


def test_default_store_comes_from_tuner_db(sqlite_url):
    _empty_store(sqlite_url)
    result = run_tuner("results", "--format", "json", env={"TUNER_DB": sqlite_url})
    assert result.exit_code == 0 and result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("results", "--shape", "16,16,x"), ("malformed shape",)),
        (("results", "--shape", "1,2"), ("malformed shape",)),
        (("results", "--status", "great"), ("unknown trial status",)),
        (("results", "--format", "xml"), ("unknown format",)),
        (("show", "1", "--format", "csv"), ("unknown format",)),
    ],
)
def test_bad_options_are_one_line_errors(sqlite_url, args, fragments):
    assert_one_line_error(tuner(sqlite_url, *args), *fragments)


@pytest.mark.parametrize("url", ["not a url", "://nothing", "postgresql://u:pw@host:notaport/db"])
def test_malformed_url(url):
    result = tuner(url, "results")
    assert_one_line_error(result, "URL")
    assert "pw@" not in result.stderr


def test_unknown_scheme():
    assert_one_line_error(tuner("oracle2://x/y", "results"), "oracle2")


def test_unwritable_path():
    assert_one_line_error(tuner("sqlite:////proc/nope/x.db", "results"), "/proc/nope")


@pytest.mark.parametrize("url", [PG_WITH_PASSWORD, f"postgresql://tuner@127.0.0.1:1/tuner?password={SECRET}",
                                 f"postgresql://tuner@127.0.0.1:1/tuner?sslmode=prefer&sslpassword={SECRET}"])
@pytest.mark.parametrize(
    "args", [("results",), ("results", "--format", "json"), ("show", "1"), ("db", "info"), ("db", "upgrade")]
)
def test_password_is_never_printed(url, args):
    """Every form of credential libpq and SQLAlchemy accept: in the userinfo, or as a query parameter."""
    result = tuner(url, *args)
    assert_one_line_error(result, "127.0.0.1", "***")
    assert SECRET not in result.stderr + result.stdout


@pytest.mark.parametrize("arg", [f"--db=postgresql://u:{SECRET}@h/db", f"postgresql://u@h/db?password={SECRET}",
                                 f"postgresql://u@h/db?sslmode=require&sslpassword={SECRET}", f"password={SECRET}"])
def test_stored_command_lines_hold_no_secret(arg):
    from tuner.store.redact import redact_command_line

    [shown] = redact_command_line([arg])
    assert SECRET not in shown and "***" in shown


def test_password_hidden_in_help(monkeypatch):
    monkeypatch.setenv("TUNER_DB", PG_WITH_PASSWORD)
    result = run_tuner("results", "--help")
    assert "tuner:***@127.0.0.1:1" in result.stdout.replace("\n", "")
    assert SECRET not in result.stdout


def test_show_and_results_never_send_stored_escape_sequences_to_the_terminal(sqlite_url):
    """Stored text is data: an escape sequence in an error or log is shown as \\x1b, not executed."""
    from store_factories import H100, trial

    from tuner.status import TrialStatus
    from tuner.store import open_store

    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        tid = store.add_trial(trial(run, status=TrialStatus.COMPILE_ERROR, median_us=None,
                                    error="boom \x1b[2J\x1b]0;pwned\x07", compile_log="log \x1b[31mred\x1b[0m\nline2"))
    shown = tuner(sqlite_url, "show", str(tid))
    assert shown.exit_code == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "boom \\x1b[2J" in shown.stdout and "line2" in shown.stdout
    listed = tuner(sqlite_url, "results")
    assert listed.exit_code == 0 and "\x1b" not in listed.stdout
