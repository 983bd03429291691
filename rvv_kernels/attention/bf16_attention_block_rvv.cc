// RVV 1.0 prefill-attention block (VLEN-agnostic): several query rows of one
// sequence against one KV head.
//
// The decode row kernel spends one reduction per key on a single query row.
// Here the block's rows share every key, so the block becomes two small GEMMs
// over FP32 copies made once per block: K^T (d x keys, by strided stores) and
// V (keys x d). One GEMM tile serves both: kTileRows rows over a chunk of
// columns (e32m8; keys for the scores, the head dimension for the values),
// each row of K^T or V feeding kTileRows scalar-vector FMAs. Three
// accumulator groups and one operand group fill the 32 vector registers. No
// reduction instruction in either GEMM; the copies are 2 * keys * d elements
// against 2 * rows * g * keys * d MACs.
#include <riscv_vector.h>

#include <algorithm>
#include <vector>

#include "rvv_kernels/attention/attention_ukernels.h"
#include "rvv_kernels/attention/rvv_softmax.h"
#include "rvv_kernels/base/rvv_lmul.h"

namespace rvascend {
namespace {

using V = rvv::Lmul<8>;
using F = V::F;
constexpr size_t kTileRows = 3;

struct BlockScratch {
  std::vector<float> q, kt, v, p;
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
  s.kt.resize(d * keys);
  s.v.resize(keys * d);
  s.p.resize(rows * keys);
  float* q = s.q.data();
  float* kt = s.kt.data();
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
    for (size_t i = 0; i < d;) {
      const size_t vl = V::SetVl(d - i);
      __riscv_vsse32_v_f32m8(kt + i * keys + j, static_cast<ptrdiff_t>(keys * sizeof(float)),
                             V::LoadBf16(b.k_pool + offset + i, vl), vl);
      V::Store(v + j * d + i, V::LoadBf16(b.v_pool + offset + i, vl), vl);
      i += vl;
    }
  }
  for (size_t h = 0; h < b.g; ++h) {
    for (size_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const size_t nr = std::min(kTileRows, rows - r0);
      const size_t tile_keys = b.first_keys + r0 + nr - 1;
      float* pt = p + r0 * keys;
      // Scores: rows r0.. of q (this head) times K^T, over the tile's keys.
      GemmRows(nr, q + r0 * gd + h * d, gd, kt, keys, d, tile_keys, [&](size_t r, size_t c, F acc, size_t vl) {
        V::Store(pt + r * keys + c, acc, vl);
      });
      // Each row's own causal length; its keys up to the tile's last are
      // zero weights for the shared values loop.
      for (size_t r = r0; r < r0 + nr; ++r) {
        const size_t n = b.first_keys + r;
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
