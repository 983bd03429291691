// Buffers handed over from outside (Python, through the bindings) as an address
// and a size, checked before a kernel reads or writes them: a null, misaligned,
// too-small or wrong-typed buffer is a std::invalid_argument naming it, never
// an out-of-bounds access.
#ifndef RVV_KERNELS_BASE_CHECKED_BUFFER_H_
#define RVV_KERNELS_BASE_CHECKED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace rvascend {

// A buffer from outside: its address, how many elements it holds, and, where the
// caller knows them (a tensor), each element's size in bytes and whether its
// elements are contiguous. element_size 0: not stated (a raw address).
struct Span {
  uintptr_t address = 0;
  size_t elements = 0;
  size_t element_size = 0;
  bool contiguous = true;

  bool empty() const { return address == 0 && elements == 0; }
};

template <typename T>
T* Pointer(uintptr_t address, const char* what) {
  if (address == 0) throw std::invalid_argument(std::string(what) + " is a null pointer");
  if (address % alignof(T) != 0) throw std::invalid_argument(std::string(what) + " is misaligned");
  return reinterpret_cast<T*>(address);
}

// Like Pointer, but an empty array may come as a null pointer (torch's empty tensors).
template <typename T>
T* Array(uintptr_t address, size_t count, const char* what) {
  return count == 0 ? reinterpret_cast<T*>(address) : Pointer<T>(address, what);
}

// A buffer's name for an error: a string, or a callable that makes it (built only
// when a check fails: a step checks hundreds of buffers).
inline const std::string& Named(const std::string& what) { return what; }
inline std::string Named(const char* what) { return what; }
template <typename F, typename = decltype(std::declval<const F&>()())>
std::string Named(const F& what) {
  return what();
}

// Pointer, with the name made only for the error.
template <typename T, typename What>
T* PointerTo(uintptr_t address, const What& what) {
  if (address == 0 || address % alignof(T) != 0) return Pointer<T>(address, Named(what).c_str());
  return reinterpret_cast<T*>(address);
}

// A pointer to `need` elements of T, from a buffer that holds `have`.
template <typename T, typename What>
T* Extent(uintptr_t address, size_t have, size_t need, const What& what) {
  if (have < need) {
    throw std::invalid_argument(Named(what) + " has " + std::to_string(have) + " elements; the call reads or writes " +
                                std::to_string(need));
  }
  return need == 0 ? reinterpret_cast<T*>(address) : PointerTo<T>(address, what);
}

// Extent of a Span, whose stated element size must be T's and whose elements must be
// contiguous.
template <typename T, typename What>
T* Extent(const Span& span, size_t need, const What& what) {
  if (span.element_size != 0 && span.element_size != sizeof(T)) {
    throw std::invalid_argument(Named(what) + " has elements of " + std::to_string(span.element_size) +
                                " bytes; the call reads elements of " + std::to_string(sizeof(T)));
  }
  if (!span.contiguous) throw std::invalid_argument(Named(what) + " is not contiguous");
  return Extent<T>(span.address, span.elements, need, what);
}

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_CHECKED_BUFFER_H_
