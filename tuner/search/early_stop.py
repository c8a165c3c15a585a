"""The early stop: a study ends when its best has not improved by more than the noise for N budgeted trials.

`--trials` stays the ceiling; the stop only ends a study sooner. An improvement counts only when it beats the
best at the last counted improvement by more than EARLY_STOP_NOISE (relative): a timing drifts by about 1%
between calls of one card, so smaller gains are as likely noise as a faster kernel, and small steps that
add up past the noise do count. The rule reads the study's own trials, so a resume or another worker
continues the same count. Trials already asked when the rule fires (the one asked while the last was
measured, and the compile pool's look-ahead on a GPU) are still run and stored.
"""

from __future__ import annotations

from typing import Optional, Sequence

import optuna
from optuna.trial import TrialState

from tuner.search.study import counts_toward_budget

EARLY_STOP_NOISE = 0.01  # relative: a best that moves by less is not an improvement


def trials_since_improvement(values: Sequence[Optional[float]], noise: float = EARLY_STOP_NOISE) -> int:
    """Budgeted trials (in order; None: one without a value, e.g. a compile error) since the last one that beat
    the best at the previous improvement by more than `noise`; all of them when none has a value yet."""
    record: Optional[float] = None
    since = 0
    for value in values:
        if value is not None and (record is None or value < record * (1 - noise)):
            record, since = value, 0
        else:
            since += 1
    return since


def budgeted_values(study: optuna.Study) -> list[Optional[float]]:
    """The study's budgeted trials in trial order: the objective's figure, or None for a trial without one."""
    trials = sorted((t for t in study.get_trials(deepcopy=False) if counts_toward_budget(t)), key=lambda t: t.number)
    return [t.value if t.state == TrialState.COMPLETE else None for t in trials]


def plateaued(values: Sequence[Optional[float]], patience: int, noise: float = EARLY_STOP_NOISE) -> bool:
    """Whether the last `patience` budgeted trials brought no improvement beyond the noise (never before the
    study holds more than `patience` trials: the first one sets the best the others must beat)."""
    return len(values) > patience and trials_since_improvement(values, noise) >= patience


def study_plateaued(study: optuna.Study, patience: Optional[int]) -> Optional[int]:
    """The budgeted trials `study` held when its early stop fired (`patience` from the study's attributes),
    else None (no early stop asked, or the study still improves)."""
    if patience is None:
        return None
    values = budgeted_values(study)
    return len(values) if plateaued(values, patience) else None
