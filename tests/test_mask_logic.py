"""The templates' key-range logic (kernel_templates/common/mask.h), compiled by nvcc as host code and checked
on the CPU against every (query row, key) of many shapes and windows: the tiles a work item runs over hold
every key its rows see, the tiles it skips hold none, a tile that is not flagged partial needs no mask, a
row's key bounds (first, end: what the mma.sync templates' warp_mask compares with) hide the keys hidden()
does, and the keys seen add up to Problem.flops' pair count. No GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.kernels.manifest import template_folders
from tuner.problem import window_pairs

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

WINDOWS = [(-1, -1, False), (-1, -1, True), (0, -1, True), (5, -1, True), (37, -1, True), (64, -1, True),
           (5, 3, False), (0, 0, False), (-1, 4, False), (20, -1, False), (100, 7, False), (130, 0, False)]
SHAPES = [(1, 1), (7, 7), (64, 64), (100, 300), (300, 100), (257, 257), (513, 700), (1000, 1000), (90, 1)]
BLOCKS = [(64, 64), (128, 128), (192, 80), (64, 176)]  # (rows of a work item, keys of a tile)

CHECK = r"""
#include <cstdio>
#include "common/mask.h"

template <int L, int R, bool CAUSAL>
void check(int sq, int sk, int bm, int bn) {
  using K = fc::KeyWindow<fc::Mask<L, R, 0u>, CAUSAL>;
  long long seen = 0, missed = 0, extra = 0, unflagged = 0, bounds = 0;
  for (int i = 0; i < sq; ++i) {  // every key a row sees, counted by definition
    const int p = i + sk - sq;
    for (int j = 0; j < sk; ++j) seen += !K::hidden(j, p, sk);
    for (int j = 0; j < sk + bn; ++j)  // a tail tile's keys past Sk too (common/warp_tile.h: warp_mask)
      bounds += K::hidden(j, p, sk) != (j >= K::end(p, sk) || (L >= 0 && j < K::first(p)));
  }
  for (int m0 = 0; m0 < sq; m0 += bm) {  // a work item: rows m0 .. m0 + bm - 1 (64-row warpgroups inside)
    const int p_lo = m0 + sk - sq, p_hi = p_lo + bm - 1;
    const int n0 = K::first(p_lo) / bn, n1 = (K::end(p_hi, sk) + bn - 1) / bn;  // as tile_scheduler.h
    for (int i = m0; i < m0 + bm && i < sq; ++i) {
      const int p = i + sk - sq;
      for (int j = 0; j < sk; ++j)
        if (!K::hidden(j, p, sk) && (j / bn < n0 || j / bn >= n1)) ++missed;  // a seen key in a skipped tile
    }
    for (int t = 0; t * bn < sk; ++t) {
      bool any_seen = false;
      for (int i = m0; i < m0 + bm && i < sq; ++i)
        for (int j = t * bn; j < t * bn + bn && j < sk; ++j) any_seen |= !K::hidden(j, i + sk - sq, sk);
      if (any_seen && (t < n0 || t >= n1)) ++extra;
      for (int w0 = m0; w0 < m0 + bm; w0 += 64) {  // each warpgroup's mask test (consumer_mainloop.h)
        const int w_lo = w0 + sk - sq;
        if (K::partial(t * bn, bn, w_lo, w_lo + 63, sk)) continue;
        for (int i = w0; i < w0 + 64; ++i)  // unflagged: no row of it (real or padding) may hide a key
          for (int j = t * bn; j < t * bn + bn; ++j) unflagged += K::hidden(j, i + sk - sq, sk);
      }
    }
  }
  std::printf("%d %d %d %d %d %d %d %lld %lld %lld %lld %lld\n", L, R, CAUSAL ? 1 : 0, sq, sk, bm, bn, seen,
              missed, extra, unflagged, bounds);
}

int main() {
"""


def _program() -> str:
    calls = [f"  check<{left}, {right}, {'true' if causal else 'false'}>({sq}, {sk}, {bm}, {bn});"
             for left, right, causal in WINDOWS for sq, sk in SHAPES for bm, bn in BLOCKS]
    return CHECK + "\n".join(calls) + "\n}\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[list[int]]:
    folder = tmp_path_factory.mktemp("mask_logic")
    (folder / "check.cu").write_text(_program())
    include = next(f for f in template_folders() if (Path(f) / "common" / "mask.h").is_file())
    build = subprocess.run(["nvcc", "-std=c++17", "-O1", "-I", str(include), "-o", str(folder / "check"),
                            str(folder / "check.cu")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(folder / "check")], capture_output=True, text=True, timeout=600, check=True)
    return [list(map(int, line.split())) for line in run.stdout.splitlines()]


def test_every_case_ran(results) -> None:
    assert len(results) == len(WINDOWS) * len(SHAPES) * len(BLOCKS)


def test_the_tiles_of_a_work_item_hold_every_key_its_rows_see_and_the_skipped_ones_none(results) -> None:
    bad = [r for r in results if r[8] or r[9]]
    assert not bad, f"(L, R, causal, Sq, Sk, BM, BN, seen, missed, extra, unflagged): {bad[:5]}"


def test_a_tile_not_flagged_partial_needs_no_mask(results) -> None:
    bad = [r for r in results if r[10]]
    assert not bad, f"(L, R, causal, Sq, Sk, BM, BN, seen, missed, extra, unflagged): {bad[:5]}"


def test_a_row_s_key_bounds_hide_what_hidden_hides(results) -> None:
    bad = [r for r in results if r[11]]
    assert not bad, f"(L, R, causal, Sq, Sk, BM, BN, seen, missed, extra, unflagged, bounds): {bad[:5]}"


def test_the_keys_seen_are_the_pairs_flops_count(results) -> None:
    for left, right, causal, sq, sk, *_, seen, _, _, _, _ in results:
        if left < 0 and right < 0:
            continue  # plain causal counts Sq * Sk / 2 when Sq = Sk, as FlashAttention's benchmarks do
        assert seen == window_pairs(sq, sk, left, 0 if causal else right), (left, right, causal, sq, sk)
