// RVV 1.0 prefill-attention block (VLEN-agnostic): several query rows of one
// sequence against one KV head.
//
// Each row's scores are computed as the decode row kernel computes them
// (rvv_row_scores.h: one dot product and one reduction per key), so a row's
// output is bit for bit the same alone, in a prompt, in a chunk or in a verify
// step: what deterministic inference needs, and what a score GEMM over the
// block (one FMA chain per key in another order) broke. The block's rows still
// share the values: a GEMM tile over an FP32 copy of V made once per block,
// kTileRows rows over a chunk of the head dimension (e32m8), each V row feeding
// kTileRows scalar-vector FMAs in key order, as the row kernel's value loop
// adds them.
#include <riscv_vector.h>

#include <algorithm>
#include <vector>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/attention/rvv_row_scores.h"
#include "rvv_kernels/attention/rvv_softmax.h"
#include "rvv_kernels/base/rvv_lmul.h"

namespace rvascend {
namespace {

using V = rvv::Lmul<8>;
using F = V::F;
constexpr size_t kTileRows = 3;

struct BlockScratch {
  std::vector<float> q, v, p, split;
  std::vector<const uint16_t*> k_rows;
  static BlockScratch& ThisThread() {
    thread_local BlockScratch s;
    return s;
  }
};

// The block's one microkernel, a GEMM tile with kNr (<= 3) rows:
// C[r][c] = sum_t A[r * ld_a + t] * B[t * ld_b + c] for c < n, t < depth,
// kNr accumulators over a chunk of c, each row of B feeding kNr FMAs by a
// scalar of A. Scores: A = q, B = K^T; values: A = p, B = V. Store(r, c, acc, vl)
// writes one chunk of row r.
template <size_t kNr, typename Store>
void GemmTile(const float* a, size_t ld_a, const float* b, size_t ld_b, size_t depth, size_t n, Store store) {
  for (size_t c = 0; c < n;) {
    const size_t vl = V::SetVl(n - c);
    F acc0 = V::Zero(vl), acc1 = acc0, acc2 = acc0;
    const float* row = b + c;
    for (size_t t = 0; t < depth; ++t, row += ld_b) {
      const F bv = V::Load(row, vl);
      acc0 = V::Fmacc(acc0, a[t], bv, vl);
      if (kNr > 1) acc1 = V::Fmacc(acc1, a[ld_a + t], bv, vl);
      if (kNr > 2) acc2 = V::Fmacc(acc2, a[2 * ld_a + t], bv, vl);
    }
    store(0, c, acc0, vl);
    if (kNr > 1) store(1, c, acc1, vl);
    if (kNr > 2) store(2, c, acc2, vl);
    c += vl;
  }
}

template <typename Store>
void GemmRows(size_t rows, const float* a, size_t ld_a, const float* b, size_t ld_b, size_t depth, size_t n,
              Store store) {
  if (rows == 3) {
    GemmTile<3>(a, ld_a, b, ld_b, depth, n, store);
  } else if (rows == 2) {
    GemmTile<2>(a, ld_a, b, ld_b, depth, n, store);
  } else {
    GemmTile<1>(a, ld_a, b, ld_b, depth, n, store);
  }
}

}  // namespace

void bf16_attention_block__rvv(const AttentionBlock& b) {
  const size_t d = b.d, gd = b.g * b.d, rows = b.rows;
  const size_t keys = b.first_keys + rows - 1;  // the last row's
  BlockScratch& s = BlockScratch::ThisThread();
  s.q.resize(rows * gd);
  s.v.resize(keys * d);
  s.p.resize(rows * keys);
  s.split.resize(d);
  s.k_rows.resize(keys);
  float* q = s.q.data();
  float* v = s.v.data();
  float* p = s.p.data();
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < gd;) {
      const size_t vl = V::SetVl(gd - i);
      V::Store(q + r * gd + i, __riscv_vfmul_vf_f32m8(V::LoadBf16(b.q + r * b.q_stride + i, vl), b.scale, vl), vl);
      i += vl;
    }
  }
  for (size_t j = 0; j < keys; ++j) {
    const size_t offset = static_cast<size_t>(b.slots[j]) * b.slot_stride;
    s.k_rows[j] = b.k_pool + offset;
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      V::Store(v + j * d + i, V::LoadBf16(b.v_pool + offset + i, vl), vl);
      i += vl;
    }
  }
  for (size_t h = 0; h < b.g; ++h) {
    for (size_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const size_t nr = std::min(kTileRows, rows - r0);
      const size_t tile_keys = b.first_keys + r0 + nr - 1;
      float* pt = p + r0 * keys;
      // Each row's own causal length; its keys up to the tile's last are
      // zero weights for the shared values loop (added after its own keys).
      for (size_t r = r0; r < r0 + nr; ++r) {
        const size_t n = b.first_keys + r;
        rvv::RowScores(q + r * gd + h * d, d, s.k_rows.data(), n, s.split.data(), p + r * keys);
        rvv::Softmax(p + r * keys, n);
        std::fill(p + r * keys + n, p + r * keys + tile_keys, 0.0f);
      }
      // Values: the rows' weights times V, rounded to BF16 once.
      uint16_t* ot = b.out + r0 * b.out_stride + h * d;
      GemmRows(nr, pt, keys, v, d, tile_keys, d, [&](size_t r, size_t c, F acc, size_t vl) {
        V::StoreBf16(ot + r * b.out_stride + c, acc, vl);
      });
    }
  }
}

}  // namespace rvascend
