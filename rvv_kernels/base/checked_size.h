// Size products of extents that come from outside (a model file, a caller),
// checked for overflow: a product that wraps passes any extent check and the
// kernel then indexes far past its buffer (layout_bytes("Q8_0", 2**63 + 1,
// 32, 64) once gave 2176 and the kernel read row 190 of a 34-byte buffer).
#ifndef RVV_KERNELS_BASE_CHECKED_SIZE_H_
#define RVV_KERNELS_BASE_CHECKED_SIZE_H_

#include <cstddef>
#include <stdexcept>
#include <string>

namespace rvascend {

// a * b * ..., or std::invalid_argument naming `what` if it does not fit in size_t.
inline size_t CheckedProduct(const char* what, size_t a) { return a; }

template <typename... Rest>
size_t CheckedProduct(const char* what, size_t a, size_t b, Rest... rest) {
  size_t ab;
  if (__builtin_mul_overflow(a, b, &ab)) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                                " overflows a 64-bit size");
  }
  return CheckedProduct(what, ab, rest...);
}

// a + b, or std::invalid_argument naming `what`.
inline size_t CheckedSum(const char* what, size_t a, size_t b) {
  size_t s;
  if (__builtin_add_overflow(a, b, &s)) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                                " overflows a 64-bit size");
  }
  return s;
}

// Elements spanned by `rows` rows of `cols` elements `row_stride` apart (0 if empty).
inline size_t SpannedElements(const char* what, size_t rows, size_t cols, size_t row_stride) {
  if (rows == 0 || cols == 0) return 0;
  return CheckedSum(what, CheckedProduct(what, rows - 1, row_stride), cols);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_CHECKED_SIZE_H_
