"""What the store answers for a variant a study proposes again, remembered for the search of one study.

A sampler on a small space proposes points its study already holds over and over (a decode problem of 150
feasible variants searched for 100 trials: ~15 repeats per measured trial in a replay), and each repeat was
answered by a query of the store (~8 ms on 2 shared cores, ~40% of an ask), while the card waited for the next
trial. A stored trial never changes, so a found answer is kept; a point with none is looked up again each
time (another worker, or this search, may store it meanwhile).
"""

from __future__ import annotations

from typing import Callable, Optional, Set

from tuner.kernels.variant import Variant
from tuner.store import TrialRow, canonical_json

Lookup = Callable[[Variant], Optional[TrialRow]]
Keys = Callable[[], Set[str]]


class KnownAnswers:
    """The store's answer for each variant of one study's problem (by its parameters), found once."""

    def __init__(self, lookup: Lookup, stored_keys: Keys) -> None:
        self._lookup = lookup
        self._stored_keys = stored_keys
        self._earlier: Optional[Set[str]] = None  # the keys stored before the study started, listed at first need
        self._found: dict[str, TrialRow] = {}
        self.queries = 0  # store lookups made (a found answer is not looked up again)

    def earlier(self, variant: Variant) -> Optional[TrialRow]:
        """The store's answer for a point the study does not hold: an earlier run's measurement, if any."""
        if self._earlier is None:
            self.queries += 1
            self._earlier = self._stored_keys()
        return self(variant) if canonical_json(variant.stored_params()) in self._earlier else None

    def __call__(self, variant: Variant) -> Optional[TrialRow]:
        key = canonical_json(variant.stored_params())
        row = self._found.get(key)
        if row is None:
            self.queries += 1
            row = self._lookup(variant)
            if row is not None:
                self._found[key] = row
        return row
