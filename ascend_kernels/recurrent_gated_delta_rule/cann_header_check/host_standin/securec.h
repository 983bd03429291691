// Stand-in for Huawei's securec (bounds-checked C library) that metadef's
// headers include: the two functions they call, declared only.
#ifndef RGDR_STANDIN_SECUREC_H_
#define RGDR_STANDIN_SECUREC_H_
#include <cstddef>
typedef int errno_t;
#define EOK 0
errno_t memset_s(void* dest, size_t dest_max, int c, size_t count);
errno_t memcpy_s(void* dest, size_t dest_max, const void* src, size_t count);
#endif  // RGDR_STANDIN_SECUREC_H_
