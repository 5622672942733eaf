#pragma once
// How the ranks of a dhelix-run job agree before they act: every rank contributes what it
// found (a setup failure, a non-finite loss, a signal) to one all_reduce_max over the world
// (runtime/comm/communicator.h), and all of them take the same branch afterwards. A rank
// that went its own way would leave the others waiting in a collective for ever.
//
// Over MPI the world is MpiCommunicator(MPI_COMM_WORLD); in a unit test it is a
// LoopbackWorld's (runtime/comm/loopback_communicator.h), one thread per rank.

#include <exception>

#include "runtime/comm/communicator.h"

namespace dhelix::rt {

/// Whether `mine` is true on any rank of `world`; the same answer on every rank. Collective.
bool any_rank(Communicator& world, bool mine);

/// The setup agreement: returns when no rank failed (`failure` null everywhere). Otherwise
/// throws SetupFailure on every rank with the code of the first (lowest) rank that failed:
/// that rank gets its own error's message (where `failure` holds an Error), every other
/// rank "stopped: rank N failed" marked reported_elsewhere, so that the message is printed
/// once. Collective.
void agree_on_setup(Communicator& world, std::exception_ptr failure);

}  // namespace dhelix::rt
