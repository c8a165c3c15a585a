"""The SQL results store (SQLite by default, PostgreSQL for a team).

    store = open_store()                       # TUNER_DB or the user's data folder
    run = store.start_run(RunInfo.for_this_process(gpu_name="NVIDIA H100", profile="h100"))
    store.add_trial(TrialRecord(run_id=run, problem=..., template=..., ...))
    store.best_trials(TrialFilter(gpu="h100"))
"""

from tuner.store.engine import default_db_url
from tuner.store.records import (
    BaselineRecord,
    BaselineRow,
    ConfirmedRow,
    ConfirmRecord,
    NcuMetric,
    RunInfo,
    TrialDetail,
    TrialFilter,
    TrialRecord,
    TrialRow,
    canonical_json,
)
from tuner.store.redact import redact_url
from tuner.store.schema import StoreInfo, store_info, upgrade_store
from tuner.store.store import Store, open_store

__all__ = [
    "BaselineRecord",
    "ConfirmRecord",
    "ConfirmedRow",
    "BaselineRow",
    "NcuMetric",
    "RunInfo",
    "Store",
    "StoreInfo",
    "TrialDetail",
    "TrialFilter",
    "TrialRecord",
    "TrialRow",
    "canonical_json",
    "default_db_url",
    "open_store",
    "redact_url",
    "store_info",
    "upgrade_store",
]
