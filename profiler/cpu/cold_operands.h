#pragma once
// Parameter-reading ops timed on operands the caches do not hold, as in a run. A profiler
// that runs one GEMM over and over on the same three buffers times it with its weight in
// L2; a training step never finds it there: between two uses of one layer's weights come
// every other layer's weights, gradients and optimizer states and the other micro-batches'
// activations (the emulated-link benchmark jobs of docs/runtime.md touch 30-70 MB per rank
// and step, against a 1 MiB L2 and a 32 MiB L3 that both ranks share). Timed hot, that
// benchmark's GEMMs ran 10-24 % slower in the run than in the profile, so its plans were
// optimistic by construction. GPU profilers take the same care: Triton's do_bench and
// nvbench flush the L2 cache before every timed kernel.
//
// Which ops. Those that read a parameter (or write its gradient): GEMMs (forward, dgrad and
// wgrad share a signature), grouped GEMMs, the router, the head and the embedding. The
// others (norms, activations, attention, the residual add, permutes, the loss) read what
// the op before them has just written, which a run finds in L2 as a hot profile does: timed
// cold they came out 30-110 % slower than the run measured them (norms, SwiGLU), timed hot
// within a few per cent. A GEMM's activation operand goes cold with its weight here, as
// the buffers cycle together; the run measured those GEMMs between the hot and the cold
// figure, nearer the cold one.
//
// How. Such an op gets K copies of its buffers, K the smallest count whose buffers together
// exceed `cold_bytes` (the host's last-level cache by default, host_last_level_cache_bytes),
// and every run takes the next copy: nothing is flushed inside the timed region, and the
// shorter op of a pair, which runs back to back within one sample (cpu_timing.h), is cold
// on every run too. Communication ops keep one set of buffers: what they cost is the
// link's and the transport's.
//
// Example: a 256 x 256 x 256 fp32 GEMM owns 768 KiB (A, B, C); with a 32 MiB cache it gets
// 43 copies (33 MiB), and its 44th run uses the first copy again, long evicted.

#include <cstdint>
#include <vector>

#include "lib/op_catalogue.h"
#include "profiler/cpu/cpu_op_runner.h"

namespace dhelix::cpu_profile {

/// Most copies of one op's buffers (a tiny op would otherwise get thousands).
inline constexpr int64_t kMaxColdCopies = 512;

/// The last-level cache of the host's cpu0 in bytes, as sysfs gives it (else sysconf's
/// L3), 32 MiB when neither is known.
int64_t host_last_level_cache_bytes();

/// Whether ops of `kind` read a parameter or write its gradient (file comment).
bool reads_parameters(OpKind kind);

/// How many copies of `buffer_bytes` exceed `cold_bytes`: 1 when cold_bytes <= 0 or
/// buffer_bytes <= 0, at most kMaxColdCopies.
int64_t cold_copies(int64_t buffer_bytes, int64_t cold_bytes);

/// A runnable whose n-th run runs copies[n mod copies.size()], owning them all (buffer_bytes
/// summed). Run by one thread at a time. copies must not be empty.
RunnableOp cycle_runnables(std::vector<RunnableOp> copies);

/// A runnable cycling through cold_copies(...) copies of make_runnable_op(op, comm) when
/// op reads parameters and cold_bytes > 0; make_runnable_op(op, comm) otherwise.
RunnableOp make_cold_runnable_op(const Op& op, const CommBinding& comm, int64_t cold_bytes);

}  // namespace dhelix::cpu_profile
