// Drives ggml's RVV quantized dot products and GEMVs, built at bench time from
// llama.cpp's source distribution (bench/quantized_peers.py); nothing of ggml is
// in this repository. The prototypes and block sizes below are the published
// GGML format facts (quant_format.h); the buffers' contents do not change the
// instruction count, so they are left as allocated.
//   ggml_peer_gemv --fn=NAME --n=N --k=K
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
using VecDot = void (*)(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
using Gemv = void (*)(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
#define GGML_VEC_DOT(w, a) \
  void ggml_vec_dot_##w##_##a(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
#define GGML_GEMV(w, a) void ggml_gemv_##w##_16x1_##a(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
GGML_VEC_DOT(q4_0, q8_0)
GGML_VEC_DOT(q8_0, q8_0)
GGML_VEC_DOT(q4_K, q8_K)
GGML_VEC_DOT(q6_K, q8_K)
GGML_VEC_DOT(q5_0, q8_0)
GGML_VEC_DOT(q5_1, q8_1)
GGML_VEC_DOT(q2_K, q8_K)
GGML_VEC_DOT(q3_K, q8_K)
GGML_VEC_DOT(q5_K, q8_K)
GGML_VEC_DOT(iq4_nl, q8_0)
GGML_VEC_DOT(iq4_xs, q8_K)
GGML_GEMV(q4_0, q8_0)
GGML_GEMV(q8_0, q8_0)
GGML_GEMV(q4_K, q8_K)
GGML_GEMV(q2_K, q8_K)
GGML_GEMV(iq4_nl, q8_0)
}

namespace {

// One ggml entry point: its name, and the bytes of a weight block and of an activation
// block (q8_0: 34 per 32, q8_1: 36 per 32, q8_K: 292 per 256).
struct Entry {
  const char* name;
  VecDot vec_dot;
  Gemv gemv;
  int block_k;
  int weight_block_bytes;
  int act_block_bytes;
};

#define VEC_DOT(w, a, bk, wb, ab) {"vec_dot_" #w "_" #a, ggml_vec_dot_##w##_##a, nullptr, bk, wb, ab},
#define GEMV(w, a, bk, wb, ab) {"gemv_" #w "_16x1_" #a, nullptr, ggml_gemv_##w##_16x1_##a, bk, wb, ab},
const Entry kEntries[] = {
    VEC_DOT(q4_0, q8_0, 32, 18, 34) VEC_DOT(q8_0, q8_0, 32, 34, 34) VEC_DOT(q4_K, q8_K, 256, 144, 292)
    VEC_DOT(q6_K, q8_K, 256, 210, 292) VEC_DOT(q5_0, q8_0, 32, 22, 34) VEC_DOT(q5_1, q8_1, 32, 24, 36)
    VEC_DOT(q2_K, q8_K, 256, 84, 292) VEC_DOT(q3_K, q8_K, 256, 110, 292) VEC_DOT(q5_K, q8_K, 256, 176, 292)
    VEC_DOT(iq4_nl, q8_0, 32, 18, 34) VEC_DOT(iq4_xs, q8_K, 256, 136, 292)
    GEMV(q4_0, q8_0, 32, 18, 34) GEMV(q8_0, q8_0, 32, 34, 34) GEMV(q4_K, q8_K, 256, 144, 292)
    GEMV(q2_K, q8_K, 256, 84, 292) GEMV(iq4_nl, q8_0, 32, 18, 34)};

long Arg(int argc, char** argv, const char* name, long fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atol(argv[i] + prefix.size());
  }
  return fallback;
}

std::string ArgS(int argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string fn = ArgS(argc, argv, "fn");
  const int n = static_cast<int>(Arg(argc, argv, "n", 2048)), k = static_cast<int>(Arg(argc, argv, "k", 2048));
  for (const Entry& e : kEntries) {
    if (fn != e.name) continue;
    const size_t row = static_cast<size_t>(k) / e.block_k * e.weight_block_bytes;
    std::vector<unsigned char> w(row * n + 4096, 1), a(static_cast<size_t>(k) / e.block_k * e.act_block_bytes + 4096, 1);
    std::vector<float> out(n);
    if (e.vec_dot) {
      for (int r = 0; r < n; ++r) e.vec_dot(k, &out[r], 0, w.data() + r * row, 0, a.data(), 0, 1);
    } else {
      e.gemv(k, out.data(), n, w.data(), a.data(), 1, n);
    }
    std::printf("%s n=%d k=%d out[0]=%g\n", fn.c_str(), n, k, out[0]);
    return 0;
  }
  std::fprintf(stderr, "unknown --fn=%s\n", fn.c_str());
  return 2;
}
