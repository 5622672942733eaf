#include "runtime/cuda/channel_agreement.h"

#include <fmt/format.h>

#include <optional>
#include <string>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/train/setup_failure.h"

namespace dhelix::cuda {
namespace {

using rt::check_mpi;

int world_size() {
  int size = 0;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  return size;
}

// The (sender, receiver) pairs of every rank's programs, flattened, gathered from all
// ranks and turned into channel_pairs' input. A rank contributes the channels it sends on
// AND those it receives on, so that a receive no program of the peer sends still gets a
// channel, and the order check reports it instead of NCCL hanging on it.
std::vector<ChannelPair> gather_channels(const std::vector<int64_t>& my_pairs) {
  const int size = world_size();
  const int count = static_cast<int>(my_pairs.size());
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  check_mpi(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD),
            "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  std::vector<int64_t> all(static_cast<size_t>(total));
  check_mpi(MPI_Allgatherv(my_pairs.data(), count, MPI_INT64_T, all.data(), counts.data(),
                           offsets.data(), MPI_INT64_T, MPI_COMM_WORLD),
            "MPI_Allgatherv");
  std::vector<std::vector<int64_t>> send_peers_by_rank(static_cast<size_t>(size));
  for (size_t i = 0; i + 1 < all.size(); i += 2) {
    DHELIX_CHECK(all[i] >= 0 && all[i] < size && all[i + 1] >= 0 && all[i + 1] < size);
    send_peers_by_rank[static_cast<size_t>(all[i])].push_back(all[i + 1]);
  }
  return channel_pairs(send_peers_by_rank);
}

std::vector<int64_t> flattened_pairs(const std::vector<const RankProgram*>& programs,
                                     int64_t world_rank) {
  std::vector<int64_t> pairs;
  for (const RankProgram* program : programs) {
    for (const ChannelMessages& m : channel_messages(*program)) {
      if (!m.sent_tags.empty()) pairs.insert(pairs.end(), {world_rank, m.peer});
      if (!m.received_tags.empty()) pairs.insert(pairs.end(), {m.peer, world_rank});
    }
  }
  return pairs;
}

// The other end's list, in exchange for this end's, over a 2-member communicator.
std::vector<int64_t> exchange_tags(MPI_Comm pair, const std::vector<int64_t>& mine) {
  int me = 0;
  check_mpi(MPI_Comm_rank(pair, &me), "MPI_Comm_rank");
  const int other = 1 - me;
  int count = static_cast<int>(mine.size());
  int their_count = 0;
  check_mpi(MPI_Sendrecv(&count, 1, MPI_INT, other, 0, &their_count, 1, MPI_INT, other, 0, pair,
                         MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
  std::vector<int64_t> theirs(static_cast<size_t>(their_count));
  check_mpi(MPI_Sendrecv(mine.data(), count, MPI_INT64_T, other, 1, theirs.data(), their_count,
                         MPI_INT64_T, other, 1, pair, MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
  return theirs;
}

std::vector<int64_t> tags_with(const std::vector<ChannelMessages>& messages, int64_t peer,
                               bool sent) {
  for (const ChannelMessages& m : messages) {
    if (m.peer == peer) return sent ? m.sent_tags : m.received_tags;
  }
  return {};
}

// Step 4 of the file comment for one program: the first mismatch this rank sees, if any;
// fills `orders` with the senders' lists of the channels this rank receives on.
std::optional<std::string> first_mismatch(const RankProgram& program,
                                          const std::vector<ChannelPair>& channels,
                                          const std::vector<MPI_Comm>& comms, int64_t world_rank,
                                          int64_t num_layers, ReceiveOrders& orders) {
  const std::vector<ChannelMessages> messages = channel_messages(program);
  std::optional<std::string> first;
  for (size_t i = 0; i < channels.size(); ++i) {
    const ChannelPair& pair = channels[i];
    if (pair.sender != world_rank && pair.receiver != world_rank) continue;
    const bool sender = pair.sender == world_rank;
    const std::vector<int64_t> mine =
        tags_with(messages, sender ? pair.receiver : pair.sender, sender);
    const std::vector<int64_t> theirs = exchange_tags(comms[i], mine);
    auto mismatch = sender ? channel_content_mismatch(pair, mine, theirs, num_layers)
                           : channel_content_mismatch(pair, theirs, mine, num_layers);
    if (!sender) orders[pair.sender] = theirs;
    if (mismatch && !first) first = std::move(mismatch);
  }
  return first;
}

// Throws on every rank when any rank found a mismatch (collective over the world).
void agree_on_messages(const RankProgram& program, const std::optional<std::string>& mismatch) {
  const int mine = mismatch ? 1 : 0;
  int any = 0;
  check_mpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  if (any == 0) return;
  const std::string what = mismatch ? *mismatch
                                    : "the pipeline channels of another rank disagree (its "
                                      "error names the channel)";
  // Every rank throws here together, after the all-reduce: an agreed failure, which ends
  // each rank normally instead of aborting the job.
  throw rt::SetupFailure(
      ErrorCode::kInvalidInput,
      fmt::format("rank {}, {} program: {}; a message sent and never received (or "
                  "the reverse) would hang NCCL",
                  program.rank, execution_mode_name(program.mode), what));
}

}  // namespace

ChannelAgreement::ChannelAgreement(const std::vector<const RankProgram*>& programs,
                                   int64_t world_rank, int64_t num_layers)
    : world_rank_(world_rank) {
  channels_ = gather_channels(flattened_pairs(programs, world_rank_));
  try {
    split();
    for (const RankProgram* program : programs) check(*program, num_layers);
  } catch (...) {
    release_communicators();
    throw;
  }
}

ChannelAgreement::~ChannelAgreement() { release_communicators(); }

void ChannelAgreement::release_communicators() noexcept {
  for (MPI_Comm& comm : comms_) {
    if (comm != MPI_COMM_NULL) static_cast<void>(MPI_Comm_free(&comm));
    comm = MPI_COMM_NULL;
  }
}

void ChannelAgreement::split() {
  comms_.assign(channels_.size(), MPI_COMM_NULL);
  for (size_t i = 0; i < channels_.size(); ++i) {
    const bool sender = channels_[i].sender == world_rank_;
    const bool member = sender || channels_[i].receiver == world_rank_;
    check_mpi(
        MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, sender ? 0 : 1, &comms_[i]),
        "MPI_Comm_split");
  }
}

void ChannelAgreement::check(const RankProgram& program, int64_t num_layers) {
  ReceiveOrders& orders = orders_[program.mode];
  agree_on_messages(program,
                    first_mismatch(program, channels_, comms_, world_rank_, num_layers, orders));
}

}  // namespace dhelix::cuda
