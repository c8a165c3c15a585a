// The kernel arguments of the attention templates: one parameter list (the
// launcher passes it positionally, tuner/runtime/shipped/launcher.py) and the struct
// the device code reads it through.
//
// Problem: Q [B, H, Sq, D], K/V [B, Hkv, Sk, D], O like Q, all given by
// element strides (batch, head, sequence; the head dim is contiguous), so
// BHSD and BSHD both work without a copy. H must be a multiple of Hkv (GQA).
#pragma once

namespace fc {

struct AttnArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // [B, H, Sq] contiguous, or null
  long long q_sb, q_sh, q_ss;
  long long k_sb, k_sh, k_ss;
  long long v_sb, v_sh, v_ss;
  long long o_sb, o_sh, o_ss;
  int sq, sk, h_per_kv;
  float scale;  // softmax scale (natural units)
  int heads, batch;
  // FP8 inputs: real = stored x descale, one float per (batch, K/V head), [B, Hkv] contiguous (FlashAttention-3's
  // q_descale / k_descale / v_descale). Null for 16-bit inputs; ATTN_FWD_ARGS leaves them so.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  // Packed sequences (FlashAttention's varlen form): q, k, v and o hold the batch's sequences one after
  // another, [total, H, D]; sequence b's rows are cu_q[b] .. cu_q[b+1] - 1 (keys: cu_k). sq and sk are then
  // the longest sequence's lengths, batch the number of sequences. Null for a dense batch.
  const int* cu_q = nullptr;
  const int* cu_k = nullptr;
};

}  // namespace fc

// Tensors, strides and sizes, in the order every template's entry point
// takes them (a template may add parameters before or after: see its
// ATTN_FWD_PARAMS).
#define ATTN_FWD_TENSOR_PARAMS                                                                            \
  const void *q, const void *k, const void *v, void *o, float *lse, long long q_sb, long long q_sh,      \
      long long q_ss, long long k_sb, long long k_sh, long long k_ss, long long v_sb, long long v_sh,     \
      long long v_ss, long long o_sb, long long o_sh, long long o_ss, int sq, int sk, int h_per_kv,       \
      float scale

// An AttnArgs from those parameters, inside an entry point; heads and batch
// come from where the template has them (parameters or the grid).
#define ATTN_FWD_ARGS(HEADS, BATCH)                                                                       \
  fc::AttnArgs {                                                                                          \
    q, k, v, o, lse, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss, sq, sk,      \
        h_per_kv, scale, HEADS, BATCH                                                                     \
  }
