// Drives ggml's RVV quantized dot products and GEMVs, built at bench time from
// llama.cpp's source distribution (bench/count_instructions.py); nothing of
// ggml is in this repository. The prototypes and block sizes below are the
// published GGML format facts (quant_format.h); the buffers' contents do not
// change the instruction count, so they are left as allocated.
//   ggml_peer_gemv --fn=NAME --n=N --k=K
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
void ggml_vec_dot_q4_0_q8_0(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
void ggml_vec_dot_q8_0_q8_0(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
void ggml_vec_dot_q4_K_q8_K(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
void ggml_gemv_q4_0_16x1_q8_0(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
void ggml_gemv_q8_0_16x1_q8_0(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
void ggml_gemv_q4_K_16x1_q8_K(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
}

namespace {

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
  // Bytes per 32 (or 256) weights: Q4_0 18/32, Q8_0 34/32, Q4_K 144/256; activations q8_0 34/32, q8_K 292/256.
  const bool kq = fn.find("q4_K") != std::string::npos;
  const size_t wbytes = static_cast<size_t>(n) * k / (kq ? 256 : 32) *
                        (kq ? 144 : (fn.find("q8_0_q8_0") != std::string::npos || fn.find("gemv_q8_0") !=
                                     std::string::npos ? 34 : 18));
  const size_t abytes = static_cast<size_t>(k) / (kq ? 256 : 32) * (kq ? 292 : 34);
  std::vector<unsigned char> w(wbytes + 4096, 1), a(abytes + 4096, 1);
  std::vector<float> out(n);
  const size_t row = wbytes / n;
  if (fn == "vec_dot_q4_0_q8_0") {
    for (int r = 0; r < n; ++r) ggml_vec_dot_q4_0_q8_0(k, &out[r], 0, w.data() + r * row, 0, a.data(), 0, 1);
  } else if (fn == "vec_dot_q8_0_q8_0") {
    for (int r = 0; r < n; ++r) ggml_vec_dot_q8_0_q8_0(k, &out[r], 0, w.data() + r * row, 0, a.data(), 0, 1);
  } else if (fn == "vec_dot_q4_K_q8_K") {
    for (int r = 0; r < n; ++r) ggml_vec_dot_q4_K_q8_K(k, &out[r], 0, w.data() + r * row, 0, a.data(), 0, 1);
  } else if (fn == "gemv_q4_0_16x1_q8_0") {
    ggml_gemv_q4_0_16x1_q8_0(k, out.data(), n, w.data(), a.data(), 1, n);
  } else if (fn == "gemv_q8_0_16x1_q8_0") {
    ggml_gemv_q8_0_16x1_q8_0(k, out.data(), n, w.data(), a.data(), 1, n);
  } else if (fn == "gemv_q4_K_16x1_q8_K") {
    ggml_gemv_q4_K_16x1_q8_K(k, out.data(), n, w.data(), a.data(), 1, n);
  } else {
    std::fprintf(stderr, "unknown --fn=%s\n", fn.c_str());
    return 2;
  }
  std::printf("%s n=%d k=%d out[0]=%g\n", fn.c_str(), n, k, out[0]);
  return 0;
}
