"""`tuner results`, `tuner show`, `tuner db info|upgrade|downgrade`: reading and migrating the results store."""

from __future__ import annotations

import csv
import io
import json
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from tuner.cli.state import (
    MAX_ID,
    OUTPUT_FORMATS,
    DbOption,
    at_most,
    console,
    may_create_store,
    output_format,
    say,
    state,
    use_db,
)
from tuner.cli.journal_check import warn_if_journal_damaged
from tuner.cli.tables import hanging, results_table, trial_detail
from tuner.dtypes import names_text
from tuner.problem import parse_shape
from tuner.store import TrialFilter, TrialRow, default_db_url, open_store, store_info, upgrade_store
from tuner.store.schema import downgrade_store
from tuner.store.redact import redact_url


def results_command(
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile name, or part of the GPU name.")] = None,
    shape: Annotated[Optional[str], typer.Option(help="Problem shape B,H,S,D or B,H,Sq,Sk,D.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help=f"{names_text()}.")] = None,
    causal: Annotated[Optional[bool], typer.Option("--causal/--no-causal", help="Only causal / non-causal.")] = None,
    kernel_pass: Annotated[Optional[str], typer.Option("--pass", help="Only forward or backward problems.")] = None,
    template: Annotated[Optional[str], typer.Option(help="Kernel template name.")] = None,
    status: Annotated[
        Optional[str], typer.Option(help="ok, pruned, compile_error, launch_error, timeout or incorrect.")
    ] = None,
    best: Annotated[bool, typer.Option("--best", help="Only the fastest ok trial per problem and GPU profile.")] = False,
    limit: Annotated[int, typer.Option(min=1, callback=at_most(MAX_ID), help="At most this many rows.")] = 50,
    fmt: Annotated[str, typer.Option("--format", help="table, json or csv.")] = "table",
    db: DbOption = None,
) -> None:
    """List stored trials (newest first), or the best one per problem with --best."""
    use_db(db)
    fmt = output_format(fmt, OUTPUT_FORMATS)
    filt = TrialFilter(gpu=gpu, shape=parse_shape(shape) if shape else None, dtype=dtype, causal=causal,
                       kernel_pass=kernel_pass, template=template, status=status, limit=limit)
    with open_store(state.db_url, create=may_create_store()) as store:
        rows = store.prefer_confirmed(store.best_trials(filt)) if best else store.query_trials(filt)
        where = store.url
        warn_if_journal_damaged(store)
    if fmt == "json":
        typer.echo(json.dumps([row.to_dict() for row in rows], indent=2))
    elif fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=TrialRow.CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(row.csv_row() for row in rows)
        typer.echo(buffer.getvalue(), nl=False)
    else:
        console.print(results_table(rows, best) if rows else "no trials match", markup=False, highlight=False)
        say(f"store: {where}")


def show_command(
    trial_id: Annotated[int, typer.Argument(min=1, callback=at_most(MAX_ID), help="Trial id (see `tuner results`).")],
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    db: DbOption = None,
) -> None:
    """Everything stored about one trial: parameters, timings, baselines, ncu metrics, errors."""
    use_db(db)
    fmt = output_format(fmt, ("table", "json"))
    with open_store(state.db_url, create=may_create_store()) as store:
        detail = store.trial_detail(trial_id)
        confirmed = store.confirmed(detail.problem, detail.profile)
        warn_if_journal_damaged(store)
    confirmed = confirmed if confirmed is not None and confirmed.trial_id == detail.id else None
    if fmt == "json":
        data = detail.to_dict()
        data["confirmed"] = None if confirmed is None else {
            "run_id": confirmed.run_id, "median_us": confirmed.median_us, "ratio": confirmed.ratio,
            "baseline_impl": confirmed.baseline_impl, "rounds": confirmed.rounds}
        typer.echo(json.dumps(data, indent=2))
        return
    for part in trial_detail(detail, confirmed):
        if isinstance(part, Text):  # wrapped here (rich would not indent the continuation lines)
            part = hanging(part, console.width)
        console.print(part, soft_wrap=not isinstance(part, Table))


def db_info_command(db: DbOption = None) -> None:
    """Print the store URL (password hidden), backend and schema revision."""
    use_db(db)
    info = store_info(state.db_url)
    line = "up to date" if info.up_to_date else "outdated: run `tuner db upgrade`"
    if info.revision is None:
        line = "empty: created on first use"
    for text in (f"url: {info.url}", f"backend: {info.backend}",
                 f"revision: {info.revision or '-'} (newest {info.head}, {line})"):  # fmt: skip
        say(text)


def db_upgrade_command(db: DbOption = None) -> None:
    """Migrate the store's schema to the newest revision (creates a new store)."""
    use_db(db)
    before, after = upgrade_store(state.db_url)
    where = redact_url(state.db_url or default_db_url())
    if before == after:
        say(f"{where} is already at revision {after}")
    else:
        say(f"upgraded {where} from revision {before or 'none'} to {after}")


def db_downgrade_command(
    revision: Annotated[str, typer.Argument(help="Schema revision to go back to (see `tuner db info`), or base.")],
    db: DbOption = None,
) -> None:
    """Take the store's schema back to an older revision; refused, changing nothing, where that would delete data."""
    use_db(db)
    before, after = downgrade_store(state.db_url, revision)
    where = redact_url(state.db_url or default_db_url())
    if before == after:
        say(f"{where} is already at revision {after}")
    else:
        say(f"downgraded {where} from revision {before} to {after} (`tuner db upgrade` goes back up)")
