// Packed persistent kernels (TileScheduler::WARP_WALK): the Q loader hands each work item to the consumers.
//
// It posts the item in each consumer's mailbox (SmemLayout::mail) before it arms that consumer's Q load: the
// mbarrier arrive releases the stores, the consumer's wait on q_full acquires them; it writes the next one only
// after the consumer has freed its Q rows (q_empty, on which every consumer thread arrives: an arrive releases
// its own thread's reads of the mailbox only). After the last item it posts an end mark on a plain arrive. So the consumers hold no walk across their main loop: the walk's level, first item
// and count are warp-uniform, and with them held ptxas kept the loop's stage descriptors out of uniform
// registers in the one-consumer, D64 n64 and D256 variants (R2UR in the loop; benchmarks/NOTES.md, session 26).
#pragma once

#include <stdint.h>

#include "../common/ptx_sm90.h"
#include "config.h"
#include "tile_scheduler.h"

namespace fc {

// By the Q loader, after waiting for consumer c's Q rows to be free. n0 and n_tiles are not posted: the
// consumer derives them (TileScheduler::key_span), where a variant without a window knows n0 is 0.
template <class C>
__device__ __forceinline__ void post_item(const SmemLayout<C>& sm, int c, const Work& it) {
  int4* box = sm.mail(c);
  box[0] = make_int4(it.m0, it.sq, it.sk, it.q_row);
  box[1] = make_int4(it.h, it.b, 0, 0);  // 16 bytes: an 8-byte store made the 24-register loader spill
}

// By the Q loader once its walk has run out; `round` items were posted.
template <class C>
__device__ __forceinline__ void post_end(const SmemLayout<C>& sm, int round) {
  for (int c = 0; c < C::CONSUMERS; ++c) {
    mbar_wait(sm.q_empty(c), (round & 1) ^ 1);
    sm.mail(c)[0].x = -1;  // m0
    mbar_arrive(sm.q_full(c));
  }
}

// By consumer c: its `round`-th item, once its Q rows have landed; false at the end mark. n_tiles is broadcast
// from lane 0 so that ptxas knows it warp-uniform, and the ring's slots with it: read from shared memory, each
// thread's copy is its own to ptxas, and it selected the stage descriptors in ordinary registers (R2UR in the
// one-consumer loop; broadcasting the first row and lengths as well did that too).
template <class C>
__device__ __forceinline__ bool take_item(const TileScheduler<C>& sched, const SmemLayout<C>& sm, int c, int round,
                                          Work& it) {
  mbar_wait(sm.q_full(c), round & 1);
  const int4 x = sm.mail(c)[0];
  const int2 y = *reinterpret_cast<const int2*>(sm.mail(c) + 1);
  it.m0 = x.x;
  it.sq = x.y;
  it.sk = x.z;
  it.q_row = x.w;
  it.h = y.x;
  it.b = y.y;
  it.skip = false;
  if (it.m0 < 0) return false;
  sched.key_span(it);
  it.n_tiles = __shfl_sync(0xffffffffu, it.n_tiles, 0);
  return true;
}

}  // namespace fc
