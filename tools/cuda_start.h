#pragma once
// What dhelix-run and dhelix-profile do before MPI_Init when the run may use CUDA: the
// environment CUDA reads when it starts (runtime/cuda/cuda_environment.h) must be in place
// before MPI_Init, since a CUDA-aware MPI may start CUDA there. The command line is not
// parsed yet at that point (mpirun may add arguments that MPI_Init removes), so it is
// scanned for the backend alone.

namespace dhelix {

/// Whether `argv` asks for the CUDA backend: "--backend cuda" or "--backend=cuda" before a
/// "--" (the last --backend wins, as CLI11 parses it). A CPU run leaves the environment
/// alone: a CPU run has no use for CUDA's settings, and a CUDA-aware MPI would start CUDA
/// with them for nothing.
bool command_line_asks_for_cuda(int argc, const char* const* argv);

}  // namespace dhelix
