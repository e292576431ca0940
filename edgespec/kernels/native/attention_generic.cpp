// attention_core.inc compiled for generic (see CMakeLists.txt for its flags).
#include "attention_core.h"
#include "exp_neg.h"

namespace edgespec_native {
#define ATTN_FN attn_items_generic
#include "attention_core.inc"
}  // namespace edgespec_native
