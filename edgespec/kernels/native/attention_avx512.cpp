// attention_core.inc compiled for avx512 (see CMakeLists.txt for its flags).
#include "attention_core.h"

namespace edgespec_native {
#define ATTN_FN attn_items_avx512
#include "attention_core.inc"
}  // namespace edgespec_native
