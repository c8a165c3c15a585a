"""The confirm stage in the store: its rounds, its winner, and the best rows that prefer it (part of Store)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any, ContextManager, Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.problem import Problem
from tuner.runtime.energy import Energy, energy_of
from tuner.store import queries as q
from tuner.store.models import ConfirmationTable, ConfirmTimingTable, ProblemTable
from tuner.store.records import ConfirmedRow, ConfirmRecord, TrialDetail, TrialRow
from tuner.store.writes import figures, get_or_create, num


def _round_figures(rec: ConfirmRecord, impl: str, r: int) -> dict[str, Optional[float]]:
    """The energy and isolated µs of one implementation's round r (None where not measured)."""
    energy, isolated = rec.energy.get(impl, ()), rec.isolated_us.get(impl, ())
    return figures(energy[r] if r < len(energy) else None, isolated[r] if r < len(isolated) else None)


class ConfirmationStore:
    """Store's confirm-stage methods (Store provides _write, _read, _require_run and trial_detail)."""

    def _write(self, action: str) -> ContextManager[Session]: ...  # type: ignore[empty-body]

    def _read(self, action: str) -> ContextManager[Session]: ...  # type: ignore[empty-body]

    def _require_run(self, session: Session, run_id: int) -> None: ...

    def trial_detail(self, trial_id: int) -> TrialDetail: ...  # type: ignore[empty-body]

    def add_confirmation(self, rec: ConfirmRecord) -> int:
        """Store a confirm stage and its timings in one transaction; returns its id."""
        with self._write("cannot record the confirm stage") as session:
            self._require_run(session, rec.run_id)
            problem_id = get_or_create(session, ProblemTable, rec.problem.to_dict(), q.PROBLEM_KEYS)
            row = ConfirmationTable(run_id=rec.run_id, problem_id=problem_id, rounds=rec.rounds,
                                    baseline_impl=rec.baseline_impl, winner_trial_id=rec.winner_trial_id,
                                    winner_us=num(rec.winner_us), winner_ratio=num(rec.winner_ratio),
                                    objective=None if rec.objective == "time" else rec.objective,  # NULL: time, as before 0007
                                    winner_joules_per_call=num(rec.winner_joules_per_call))
            session.add(row)
            session.flush()
            session.add_all(ConfirmTimingTable(confirmation_id=row.id, impl=impl, trial_id=trial_id, round=r,
                                               median_us=num(us), **_round_figures(rec, impl, r))
                            for impl, (trial_id, times) in rec.timings.items() for r, us in enumerate(times))
            return row.id

    def confirmed(self, problem: Problem, gpu: Optional[str] = None,
                  objective: Optional[str] = None) -> Optional[ConfirmedRow]:
        """The newest confirmed winner of `problem` (on GPU profile `gpu`, of `objective`, when given), if any."""
        stmt = q.confirmed_select(problem, gpu, objective)
        with self._read("cannot read the confirm stage") as session:
            found = session.execute(stmt).first()
        return q.to_confirmed_row(found, problem) if found is not None else None

    def prefer_confirmed(self, rows: list[TrialRow], objective: Optional[str] = None) -> list[TrialRow]:
        """Each best row replaced by its problem's confirmed winner on that GPU profile (of `objective`, when
        given), when one exists, with the confirm stage's figures set (headline_us, headline_ratio,
        headline_joules)."""
        out = []
        for row in rows:
            confirmed = self.confirmed(row.problem, row.profile, objective)
            if confirmed is None or row.id not in self.confirmed_trial_ids(confirmed.confirmation_id):
                out.append(row)  # unconfirmed, or a faster trial came after the confirm stage: it is stale
                continue
            winner = row if confirmed.trial_id == row.id else self.trial_detail(confirmed.trial_id)
            plain = {f.name: getattr(winner, f.name) for f in dataclass_fields(TrialRow)}
            out.append(TrialRow(**{**plain, "confirmed_us": confirmed.median_us, "confirmed_ratio": confirmed.ratio,
                                   "confirmed_baseline": confirmed.baseline_impl,
                                   "confirmed_joules_per_call": confirmed.joules_per_call,
                                   "confirmed_objective": confirmed.objective}))
        return out

    def confirmed_trial_ids(self, confirmation_id: int) -> set[int]:
        """The trials a confirm stage re-timed."""
        stmt = select(ConfirmTimingTable.trial_id).where(ConfirmTimingTable.confirmation_id == confirmation_id,
                                                         ConfirmTimingTable.trial_id.is_not(None)).distinct()
        with self._read("cannot read the confirm stage") as session:
            return set(session.scalars(stmt))

    def confirm_timings(self, confirmation_id: int) -> dict[str, list[float]]:
        """impl -> median µs per round of one confirm stage."""
        return {impl: [us for us, _, _ in rounds] for impl, rounds in self._confirm_rows(confirmation_id).items()}

    def confirm_energy(self, confirmation_id: int) -> dict[str, list[Optional[Energy]]]:
        """impl -> Energy per round of one confirm stage (None in a round that measured none)."""
        return {impl: [e for _, e, _ in rounds] for impl, rounds in self._confirm_rows(confirmation_id).items()}

    def confirm_isolated(self, confirmation_id: int) -> dict[str, list[Optional[float]]]:
        """impl -> median µs of isolated calls per round (None where not timed isolated)."""
        return {impl: [i for _, _, i in rounds] for impl, rounds in self._confirm_rows(confirmation_id).items()}

    def _confirm_rows(self, confirmation_id: int) -> dict[str, list[tuple[float, Optional[Energy], Any]]]:
        t = ConfirmTimingTable
        stmt = (select(t.impl, t.median_us, t.joules_per_call, t.power_w, t.sm_mhz, t.isolated_us)
                .where(t.confirmation_id == confirmation_id).order_by(t.impl, t.round))
        out: dict[str, list[tuple[float, Optional[Energy], Any]]] = {}
        with self._read("cannot read the confirm stage") as session:
            for impl, us, joules, watts, mhz, isolated in session.execute(stmt):
                out.setdefault(impl, []).append((us, energy_of(joules, watts, mhz), isolated))
        return out
