// The decode templates' packed rows: row r of a (batch, K/V head) is (query position r / group, query head
// hk * group + r % group), so one K/V tile serves the whole GQA group.
#pragma once

namespace fc {

// A packed row's query position and head within the GQA group: unsigned division, since a row index is >= 0 and
// the group >= 1 (the quotient and remainder equal the signed ones, without the signed sequence's absolute
// values and sign fix-ups).
__device__ __forceinline__ int row_position(int row, int group) { return (int)((unsigned)row / (unsigned)group); }
__device__ __forceinline__ int row_head(int row, int group) { return (int)((unsigned)row % (unsigned)group); }

}  // namespace fc
