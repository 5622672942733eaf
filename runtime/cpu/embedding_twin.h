#pragma once
// The host twin of the CUDA embedding backward (runtime/cuda/kernels_embedding.cu): the
// positions sorted stably by kernels::embedding_sort_key with the kernels' LSD radix passes
// (8-bit digits; per pass the tile counts, the scan per digit over the tiles, the digits'
// bases and the stable placement by rank), then each run of one local token adding its
// rows column by column (kernels::embedding_run_column_sum). Loop for kernel, so the
// decomposition is checked on values without a GPU (tests/runtime/embedding_twin_test.cc:
// the same bits as cpu::embedding_backward, whose rows add in position order too).

#include <cstdint>
#include <vector>

namespace dhelix::cpu {

/// The positions' keys and their order after the kernels' radix sort: sorted_keys[i] is the
/// key of position order[i]; equal keys keep ascending positions.
struct EmbeddingSortedPositions {
  std::vector<uint32_t> sorted_keys;
  std::vector<int32_t> order;
};
EmbeddingSortedPositions embedding_radix_sort(int64_t positions, const int64_t* tokens,
                                              int64_t vocab_begin, int64_t vocab_local);

/// dtable[vocab_local, dim] += the scatter of dout[positions, dim], as the kernels do it.
void embedding_backward_sorted(int64_t positions, int64_t dim, const int64_t* tokens,
                               const float* dout, int64_t vocab_begin, int64_t vocab_local,
                               float* dtable);

}  // namespace dhelix::cpu
