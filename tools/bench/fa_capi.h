/* libfa_capi.so: the steps' GPU kernels behind a C interface, on the caller's device
 * tensors and stream (tools/bench/fa_capi.cpp; ab.py reaches it through ctypes).
 *
 *   fa_plan        checks that step `step` ("07": what `flashattn run --step` takes), or
 *                  a version of its note's table ("07s1": fa_bench --versions' ids), can
 *                  run shape *s here, once and untimed; *workspace_bytes receives the
 *                  scratch the caller must pass. Null, with the reason in err, if not.
 *   fa_forward     O and L from Q, K, V (device pointers of the plan's dtype; L fp32);
 *   fa_forward_ragged  fa_forward on a ragged batch: the plan's shape has `sequences` > 0,
 *                  B = 1 and N the packed rows; offsets (sequences + 1 int32 on the device,
 *                  FlashAttention's cu_seqlens, not read by the host) cut the N rows of every
 *                  head: non-decreasing within [0, N] (an empty sequence is allowed); an offset
 *                  outside is clamped to it, one below an earlier one taken as that one, and
 *                  rows outside every sequence are left unwritten;
 *   fa_forward_paged  fa_forward with K and V a paged cache (a step that decodes from one:
 *                  "08"): k and v are pools of `pool` pages [H_kv, page, d] (page 16 to 256, a
 *                  multiple of 16); sequence b's positions page·x … in page table[b·W + x],
 *                  W = ceil(N_kv / page) (B·W int32 on the device); lengths: B int32 on the device,
 *                  sequence b's keys (N … N_kv: its N queries its last N), or null for N_kv each.
 *                  The device's tables are not read by the host: a page number outside the pool
 *                  is taken as the nearest page, a length outside [N, N_kv] as the nearest bound;
 *   fa_backward    dQ, dK, dV from Q, K, V, O, L and dO: launches, and nothing else;
 *   fa_backward_ragged  fa_backward on a ragged batch, as fa_forward_ragged;
 *   fa_free_plan
 *
 * A call that fails returns nonzero and writes one line into err (n bytes). */
#ifndef FA_CAPI_H
#define FA_CAPI_H

#define FA_CAPI __attribute__((visibility("default"))) /* what the library exports, and nothing else */

#ifdef __cplusplus
extern "C" {
#endif

/* A problem's shape (fa::Problem's fields; H_kv, N_kv = 0: H, N). dtype: 0 fp32, 1 bf16, 2 fp16.
 * scale: the softmax scale; 0: 1/sqrt(d). windowed: 0 for none (a zeroed shape has none), else
 * FlashAttention's window_size (window_left, window_right; -1 an open side). sequences: 0, or a
 * ragged batch of that many sequences packed in N rows (fa_forward_ragged). */
struct fa_shape {
  int B, H, H_kv, N, N_kv, d, causal, dtype;
  float scale;
  int windowed, window_left, window_right;
  int sequences;
};

FA_CAPI void* fa_plan(const char* step, int backward, const struct fa_shape* s, unsigned long long* workspace_bytes,
              char* err, int n);
FA_CAPI void fa_free_plan(void* plan);
FA_CAPI int fa_forward(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse, void* workspace,
               void* stream, char* err, int n);
FA_CAPI int fa_forward_ragged(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse,
                              const int* offsets, void* workspace, void* stream, char* err, int n);
FA_CAPI int fa_forward_paged(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse,
                             const int* table, const int* lengths, int page, int pool, void* workspace, void* stream,
                             char* err, int n);
FA_CAPI int fa_backward(const void* plan, const void* q, const void* k, const void* v, const void* o, const float* lse,
                const void* dout, void* dq, void* dk, void* dv, void* workspace, void* stream, char* err, int n);

FA_CAPI int fa_backward_ragged(const void* plan, const void* q, const void* k, const void* v, const void* o,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv, const int* offsets,
                               void* workspace, void* stream, char* err, int n);

#ifdef __cplusplus
}
#endif
#endif
