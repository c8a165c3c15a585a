// Compile-time configuration of the Hopper template (one instantiation per
// variant; tuner/kernels/render.py writes its arguments) and where it puts
// things in shared memory.
#pragma once

#include <stdint.h>

#include "../common/cuda_types.h"

#include "../common/mask.h"
#include "../common/utils.h"
#include "../common/ptx_sm90.h"

namespace fc {

template <class T>
struct IsBf16 {
  static constexpr bool value = false;
};
template <>
struct IsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

template <class T>
struct IsFp8 {
  static constexpr bool value = false;
};
template <>
struct IsFp8<__nv_fp8_e4m3> {
  static constexpr bool value = true;
};
template <class T>
struct OutputOf {  // the output type of inputs T: T itself, bf16 for e4m3
  using type = T;
};
template <>
struct OutputOf<__nv_fp8_e4m3> {
  using type = __nv_bfloat16;
};

template <class T_, int D_, int BM_, int BN_, int STAGES_, int SWB_, bool OVERLAP_, bool PINGPONG_,
          int PRODUCER_REGS_, bool PERSISTENT_, bool CAUSAL_, class MASK_ = NoMask, bool PACKED_ = false,
          bool TWO_P_ = false>
struct HopperConfig {
  using T = T_;  // q, k, v
  // FP8 (e4m3): q, k, v scaled by per-(batch, K/V head) descales, the output bf16. FP8 wgmma reads both
  // operands K-major, so V comes transposed ([D][keys], from a copy the launcher makes) for P V.
  static constexpr bool FP8 = IsFp8<T>::value;
  using TO = typename OutputOf<T>::type;
  static constexpr bool BF16 = IsBf16<T>::value;
  static constexpr int D = D_, BM = BM_, BN = BN_, STAGES = STAGES_;
  static constexpr int ES = FP8 ? 1 : 2;  // bytes per input element
  static constexpr int KSTEP = 32 / ES;   // the K of one wgmma: k16 (16-bit), k32 (e4m3)
  static constexpr int SWB = SWB_;        // swizzle width in bytes: 32, 64 or 128
  static constexpr int E = SWB / ES;      // input elements per swizzled row = TMA box width
  static constexpr int CB = D / E;        // column blocks per Q or K tile
  static constexpr int CBV = FP8 ? BN / E : CB;  // column blocks per V tile: keys (V^T, FP8), else the head dim
  // P scaled by 2^P_SHIFT before the e4m3 rounding (P <= 256 < 448): small probabilities keep normal
  // e4m3 values instead of flushing to zero; O / l cancels it, the log-sum-exp takes it off.
  static constexpr int P_SHIFT = FP8 ? 8 : 0;
  static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_, PERSISTENT = PERSISTENT_, CAUSAL = CAUSAL_;
  using Keys = KeyWindow<MASK_, CAUSAL_>;  // which keys a row sees (common/mask.h)
  using Cap = Softcap<MASK_>;
  // Packed sequences (AttnArgs::cu_q / cu_k): every work item reads its sequence's offsets and lengths.
  static constexpr bool PACKED = PACKED_;
  // Two P register sets, alternating by tile parity (consumer_mainloop.h, TWO_P): the 16-bit overlapped loop
  // packs S_j right after its softmax, not before Q K_{j+1}^T's issue; BN / 4 more registers a thread.
  static constexpr bool TWO_P = TWO_P_;
  static constexpr int CONSUMERS = BM / 64;
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int MIN_BLOCKS = 1;
  static constexpr int PRODUCER_REGS = PRODUCER_REGS_;
  // setmaxnreg moves registers inside the CTA's own pool, which is what it was
  // launched with: THREADS x LAUNCH_REGS (ptxas gives a setmaxnreg kernel the
  // most its launch bounds allow: 168 for 384 threads, 128 for 512). Asking
  // for more than the producer gave back blocks forever. One consumer (256
  // threads) already has 240+ registers: no split. CONSUMER_REGS is the manifest's consumer_regs
  // (attn_fwd_wgmma.toml [resources], which its constraints use): the rendered source asserts they agree.
  static constexpr bool SPLIT_REGS = CONSUMERS > 1;
  static constexpr int LAUNCH_REGS = (65536 / THREADS > 255 ? 255 : 65536 / THREADS) / 8 * 8;
  static constexpr int CONSUMER_REGS_RAW = (LAUNCH_REGS * (CONSUMERS + 1) - PRODUCER_REGS) / CONSUMERS / 8 * 8;
  static constexpr int CONSUMER_REGS = !SPLIT_REGS ? 240 : (CONSUMER_REGS_RAW > 240 ? 240 : CONSUMER_REGS_RAW);
  static_assert(!SPLIT_REGS || 128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
                "register split exceeds the CTA's register pool");
  static constexpr int Q_ROWS = 64;  // rows of a Q box: each consumer's rows load (and free) on their own
  static constexpr int Q_BYTES = BM * D * ES;  // what TMA loads
  static constexpr int Q_REGION = BM * D * 2;  // the epilogue stages the 16-bit O in the Q rows
  static constexpr int KV_BYTES = BN * D * ES;  // one K or one V tile
  // Packed persistent: each consumer's mailbox, where the Q loader posts its next work item (item_mail.h).
  static constexpr int MAIL_BYTES = PACKED && PERSISTENT ? 32 * CONSUMERS : 0;
  static constexpr int SMEM_BYTES = 1024 + Q_REGION + 2 * STAGES * KV_BYTES + 256 + MAIL_BYTES;  // = the manifest's
  static_assert((2 * CONSUMERS + 4 * STAGES) * 8 <= 256, "mbarriers must fit their 256 bytes");
  static_assert(BM % 64 == 0 && CONSUMERS >= 1 && CONSUMERS <= 3, "BM must be 64, 128 or 192");
  static_assert(BN % 16 == 0 && BN <= 256, "BN must be a multiple of 16, at most 256");
  static_assert(SWB == 32 || SWB == 64 || SWB == 128, "swizzle is 32, 64 or 128 bytes");
  static_assert(D % E == 0, "head dim must be a multiple of the swizzle width");
  static_assert(!FP8 || BN % E == 0, "FP8: the key tile must be a multiple of the swizzle width (V^T's box)");
  static_assert(!PINGPONG || CONSUMERS >= 2, "ping-pong needs two consumer warpgroups");
  static_assert(!TWO_P || (OVERLAP && !FP8), "two P register sets are for the 16-bit overlapped loop");
  static_assert(!(PACKED && FP8), "packed sequences take 16-bit inputs (an FP8 V is read transposed per batch row)");
  static_assert(PRODUCER_REGS >= 24 && PRODUCER_REGS % 8 == 0, "setmaxnreg takes multiples of 8 from 24");
};

// Shared memory, as 32-bit shared-window addresses: the Q tile, the K and V
// rings, then the mbarriers (SMEM_BYTES reserves 1024 bytes of alignment
// slack and 256 of barriers), then the packed persistent kernels' mailboxes.
template <class C>
struct SmemLayout {
  uint8_t* raw_ptr;  // the dynamic shared memory as the kernel declared it
  uint32_t raw, sQ, sK, sV, bars;

  __device__ __forceinline__ explicit SmemLayout(uint8_t* smem_raw) : raw_ptr(smem_raw) {
    // Swizzled TMA tiles must start on a 1024-byte boundary.
    raw = smem_u32(smem_raw);
    sQ = (raw + 1023) & ~1023u;
    sK = sQ + C::Q_REGION;
    sV = sK + C::STAGES * C::KV_BYTES;
    bars = sV + C::STAGES * C::KV_BYTES;
  }

  // Each consumer's Q rows have their own full/empty pair, so one consumer
  // can start its next work item while another is still finishing.
  __device__ __forceinline__ uint32_t q_full(int c) const { return bars + 8 * c; }
  __device__ __forceinline__ uint32_t q_empty(int c) const { return bars + 8 * (C::CONSUMERS + c); }
  static constexpr int KV_BAR0 = 2 * C::CONSUMERS;
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 8 * (KV_BAR0 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return bars + 8 * (KV_BAR0 + C::STAGES + s); }
  // K and V slots are freed separately: K as soon as Q K^T has read it.
  __device__ __forceinline__ uint32_t k_empty(int s) const { return bars + 8 * (KV_BAR0 + 2 * C::STAGES + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return bars + 8 * (KV_BAR0 + 3 * C::STAGES + s); }
  // Consumer c's mailbox (MAIL_BYTES, 32 bytes each), written and read through the generic pointer.
  __device__ __forceinline__ int4* mail(int c) const {
    return reinterpret_cast<int4*>(raw_ptr + (bars - raw) + 256 + 32 * c);
  }

  // By one thread, before the CTA's first __syncthreads.
  __device__ __forceinline__ void init_barriers() const {
    for (int c = 0; c < C::CONSUMERS; ++c) {
      mbar_init(q_full(c), 1);
      // After its epilogue: lane 0 of each warp of consumer c; in packed persistent kernels every thread, each
      // releasing its own read of the item mailbox (item_mail.h) before the loader writes the next item.
      mbar_init(q_empty(c), C::MAIL_BYTES > 0 ? 128 : 4);
    }
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * C::CONSUMERS);
      mbar_init(v_empty(s), 4 * C::CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
};

}  // namespace fc
