// Which keys a query row sees, and the logit softcap: the mask features every
// template compiles in (tuner/kernels/render.py writes the Mask<...> of each
// variant; NoMask is a variant without them).
//
// Rows are aligned to the keys' end (bottom-right): query i is at position
// i + Sk - Sq among the keys. A row at position p sees key j iff
//   p - LEFT <= j (LEFT >= 0), j <= p (causal), j <= p + RIGHT (RIGHT >= 0),
// and j < Sk; -1 is an unbounded side (FlashAttention's window_size). The key
// range functions are host code too: tests/test_mask_logic.py checks them on
// the CPU against every (row, key) of many shapes.
#pragma once

namespace fc {

// The softcap travels as its fp32 bits (C++17 takes no float template
// argument); 0 is off.
template <int LEFT_ = -1, int RIGHT_ = -1, unsigned SOFTCAP_BITS = 0u>
struct Mask {
  static constexpr int LEFT = LEFT_, RIGHT = RIGHT_;
  static constexpr bool SOFTCAPPED = SOFTCAP_BITS != 0u;
  __device__ __forceinline__ static float softcap() { return __uint_as_float(SOFTCAP_BITS); }
};
using NoMask = Mask<>;

template <class Mask, bool CAUSAL>
struct KeyWindow {
  static constexpr int LEFT = Mask::LEFT, RIGHT = Mask::RIGHT;
  static_assert(!(CAUSAL && RIGHT > 0), "a causal row sees no key right of it");

  // First key the row at position p may see (0 without a left bound).
  __host__ __device__ __forceinline__ static int first(int p) {
    if constexpr (LEFT >= 0) return p - LEFT > 0 ? p - LEFT : 0;
    return 0;
  }
  // One past the last key the row at position p may see.
  __host__ __device__ __forceinline__ static int end(int p, int sk) {
    if constexpr (CAUSAL || RIGHT >= 0) {
      const int e = p + (CAUSAL ? 0 : RIGHT) + 1;
      return e < sk ? (e > 0 ? e : 0) : sk;
    }
    return sk;
  }
  // Whether the keys kv0 .. kv0+n-1 need a mask for some row at positions p_lo .. p_hi.
  __host__ __device__ __forceinline__ static bool partial(int kv0, int n, int p_lo, int p_hi, int sk) {
    bool part = kv0 + n > sk;
    if constexpr (CAUSAL) part = part || kv0 + n - 1 > p_lo;
    if constexpr (!CAUSAL && RIGHT >= 0) part = part || kv0 + n - 1 > p_lo + RIGHT;
    if constexpr (LEFT >= 0) part = part || kv0 < p_hi - LEFT;
    return part;
  }
  // Whether the row at position p does not see key j.
  __host__ __device__ __forceinline__ static bool hidden(int j, int p, int sk) {
    bool out = j >= sk;
    if constexpr (CAUSAL) out = out || j > p;
    if constexpr (!CAUSAL && RIGHT >= 0) out = out || j > p + RIGHT;
    if constexpr (LEFT >= 0) out = out || j < p - LEFT;
    return out;
  }
};

// tanh on the special-function unit (relative error about 2^-11, far under
// the 16-bit P it feeds).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Softcapping folded into the softmax scale: with S' = tanh(S * scale / cap)
// the logits are cap * S', so the softmax runs on S' with scale `cap`.
template <class Mask>
struct Softcap {
  static constexpr bool ON = Mask::SOFTCAPPED;
  // What a score is multiplied by before tanh (only when ON).
  __device__ __forceinline__ static float pre_scale(float scale) { return ON ? scale / Mask::softcap() : 1.f; }
  // The softmax scale (natural units) of what the consumer holds after apply().
  __device__ __forceinline__ static float softmax_scale(float scale) { return ON ? Mask::softcap() : scale; }
  template <int N>
  __device__ __forceinline__ static void apply(float* s, float pre) {
    if constexpr (ON) {
#pragma unroll
      for (int e = 0; e < N; ++e) s[e] = fast_tanh(s[e] * pre);
    }
  }
};

}  // namespace fc
