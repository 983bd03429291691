// Loop-unroll hint understood by both clang and GCC.
#ifndef RVV_KERNELS_BASE_UNROLL_H_
#define RVV_KERNELS_BASE_UNROLL_H_

#define RVASCEND_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define RVASCEND_UNROLL(n) RVASCEND_PRAGMA(clang loop unroll_count(n))
#elif defined(__GNUC__)
#define RVASCEND_UNROLL(n) RVASCEND_PRAGMA(GCC unroll n)
#else
#define RVASCEND_UNROLL(n)
#endif

#endif  // RVV_KERNELS_BASE_UNROLL_H_
