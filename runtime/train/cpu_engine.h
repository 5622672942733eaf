#pragma once
// The CPU backend's training engine (runtime/train/training_engine.h): StageModel in host
// memory, the plan interpreter (runtime/exec/interpreter.h) over MPI communicators, and
// AdamW on the host.

#include <memory>

#include "runtime/train/training_engine.h"

namespace dhelix::rt {

/// The CPU engine's factory; blas_threads fixes OpenBLAS's thread count for the process.
EngineFactory cpu_engine_factory(int blas_threads);

}  // namespace dhelix::rt
