#include "runtime/comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/comm/mpi_wait.h"

namespace dhelix::rt {
namespace {

class MpiTransferRequest final : public TransferRequest {
 public:
  explicit MpiTransferRequest(MPI_Request request) : request_(request) {}
  ~MpiTransferRequest() override {
    // Never throw from a destructor: an error here would also have surfaced in wait().
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  MpiTransferRequest(const MpiTransferRequest&) = delete;
  MpiTransferRequest& operator=(const MpiTransferRequest&) = delete;

  void wait() override {
    // MPI_Wait sets a finished request to MPI_REQUEST_NULL, so a second wait() returns at once.
    wait_for(request_, "MPI_Wait");
  }

 private:
  MPI_Request request_;
};

// out[count] = in_0 + in_1 + ... + in_{n-1}, added left to right; block r of `blocks`
// holds member r's contribution. Starting from block 0 (not from zero) keeps -0.0 intact.
void sum_blocks_in_rank_order(const float* blocks, int64_t n, int64_t count, float* out) {
  std::memcpy(out, blocks, static_cast<size_t>(count) * sizeof(float));
  for (int64_t r = 1; r < n; ++r) {
    const float* block = blocks + r * count;
    for (int64_t i = 0; i < count; ++i) out[i] += block[i];
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)) {
  DHELIX_CHECK(comm_ != MPI_COMM_NULL);
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm_, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size");
  rank_ = rank;
  size_ = size;

  // Group rank -> world rank, for point-to-point peers given as world ranks.
  MPI_Group own_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(comm_, &own_group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
  std::vector<int> group_ranks(static_cast<size_t>(size)), world_ranks(group_ranks.size());
  for (int r = 0; r < size; ++r) group_ranks[static_cast<size_t>(r)] = r;
  const int rc = MPI_Group_translate_ranks(own_group, size, group_ranks.data(), world_group,
                                           world_ranks.data());
  MPI_Group_free(&own_group);
  MPI_Group_free(&world_group);
  check_mpi(rc, "MPI_Group_translate_ranks");
  world_ranks_.assign(world_ranks.begin(), world_ranks.end());

  void* attribute = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attribute, &found), "MPI_Comm_get_attr");
  if (found) tag_upper_bound_ = *static_cast<int*>(attribute);
}

MpiCommunicator::~MpiCommunicator() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalised || comm_ == MPI_COMM_WORLD || comm_ == MPI_COMM_SELF) return;
  MPI_Comm_free(&comm_);
}

int MpiCommunicator::count_as_int(int64_t count, const char* operation) const {
  DHELIX_CHECK(count >= 0);
  if (count > INT_MAX) {
    throw Error(ErrorCode::kUnsupported, name_ + ": " + operation + " of " + std::to_string(count) +
                                             " elements per rank exceeds MPI's count limit of " +
                                             std::to_string(INT_MAX));
  }
  return static_cast<int>(count);
}

void MpiCommunicator::all_gather(const float* in, int64_t count, float* out) {
  const int n = count_as_int(count, "all_gather");
  if (count == 0) return;
  float* own_block = out + rank_ * count;
  if (size_ == 1) {
    if (in != own_block) std::memmove(own_block, in, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  // MPI forbids a send buffer inside the receive buffer unless it is named MPI_IN_PLACE.
  const void* send = in == own_block ? MPI_IN_PLACE : static_cast<const void*>(in);
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Allgather(send, n, MPI_FLOAT, out, n, MPI_FLOAT, comm_), "MPI_Allgather");
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(send, n, MPI_FLOAT, out, n, MPI_FLOAT, comm_, &request),
            "MPI_Iallgather");
  wait_for(request, "MPI_Iallgather");
}

void MpiCommunicator::reduce_scatter_sum(const float* in, int64_t count, float* out) {
  const int n = count_as_int(count, "reduce_scatter_sum");
  if (count == 0) return;
  if (size_ == 1) {
    std::memmove(out, in, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  // After the exchange, block r of received_ is member r's block rank().
  received_.resize(static_cast<size_t>(size_ * count));
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Alltoall(in, n, MPI_FLOAT, received_.data(), n, MPI_FLOAT, comm_),
              "MPI_Alltoall");
  } else {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ialltoall(in, n, MPI_FLOAT, received_.data(), n, MPI_FLOAT, comm_, &request),
              "MPI_Ialltoall");
    wait_for(request, "MPI_Ialltoall");
  }
  sum_blocks_in_rank_order(received_.data(), size_, count, out);
}

void MpiCommunicator::all_reduce_sum(float* inout, int64_t count) {
  DHELIX_CHECK(count >= 0);
  if (count == 0 || size_ == 1) return;
  // Blocks of ceil(count / size) elements; the zero padding of the last blocks is summed
  // and dropped.
  const int64_t block = (count + size_ - 1) / size_;
  count_as_int(block, "all_reduce_sum");
  padded_.assign(static_cast<size_t>(block * size_), 0.0f);
  std::copy(inout, inout + count, padded_.begin());
  reduce_scatter_sum(padded_.data(), block, padded_.data() + rank_ * block);
  all_gather(padded_.data() + rank_ * block, block, padded_.data());
  std::copy(padded_.begin(), padded_.begin() + count, inout);
}

void MpiCommunicator::all_to_all_v(const float* in, const int64_t* send_counts, int64_t chunks,
                                   float* out, int64_t* recv_counts, int64_t out_capacity) {
  DHELIX_CHECK(chunks >= 1);
  const auto n = static_cast<size_t>(size_);
  const int per_member = count_as_int(chunks, "all_to_all_v counts");
  // 1. The counts: chunks int64 per member, both ways.
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Alltoall(send_counts, per_member, MPI_INT64_T, recv_counts, per_member,
                           MPI_INT64_T, comm_),
              "MPI_Alltoall");
  } else {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ialltoall(send_counts, per_member, MPI_INT64_T, recv_counts, per_member,
                            MPI_INT64_T, comm_, &request),
              "MPI_Ialltoall");
    wait_for(request, "MPI_Ialltoall");
  }
  // 2. Block sizes and offsets in MPI's int, checked before any data moves.
  std::vector<int> send_n(n), send_at(n), recv_n(n), recv_at(n);
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    int64_t send_block = 0, recv_block = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      send_block += send_counts[static_cast<int64_t>(j) * chunks + c];
      recv_block += recv_counts[static_cast<int64_t>(j) * chunks + c];
    }
    send_at[j] = count_as_int(sent, "all_to_all_v offset");
    recv_at[j] = count_as_int(received, "all_to_all_v offset");
    send_n[j] = count_as_int(send_block, "all_to_all_v");
    recv_n[j] = count_as_int(recv_block, "all_to_all_v");
    sent += send_block;
    received += recv_block;
  }
  if (received > out_capacity) {
    throw Error(ErrorCode::kInternal, name_ + ": all_to_all_v receives " +
                                          std::to_string(received) + " elements into a buffer of " +
                                          std::to_string(out_capacity));
  }
  // 3. The data.
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Alltoallv(in, send_n.data(), send_at.data(), MPI_FLOAT, out, recv_n.data(),
                            recv_at.data(), MPI_FLOAT, comm_),
              "MPI_Alltoallv");
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(in, send_n.data(), send_at.data(), MPI_FLOAT, out, recv_n.data(),
                           recv_at.data(), MPI_FLOAT, comm_, &request),
            "MPI_Ialltoallv");
  wait_for(request, "MPI_Ialltoallv");
}

int64_t MpiCommunicator::all_reduce_max(int64_t value) {
  int64_t largest = value;
  check_mpi(MPI_Allreduce(&value, &largest, 1, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce");
  return largest;
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait_for(request, "MPI_Ibarrier");
}

void MpiCommunicator::ring_exchange(const float* send, float* recv, int64_t count) {
  const int n = count_as_int(count, "ring_exchange");
  if (count == 0) return;
  if (size_ == 1) {
    std::memmove(recv, send, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const int next = static_cast<int>((rank_ + 1) % size_);
  const int previous = static_cast<int>((rank_ + size_ - 1) % size_);
  if (mpi_wait_mode() == MpiWaitMode::kSpin) {
    check_mpi(MPI_Sendrecv(send, n, MPI_FLOAT, next, kRingTag, recv, n, MPI_FLOAT, previous,
                           kRingTag, comm_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
    return;
  }
  // The receive is posted first, so that the neighbour's send finds it waiting.
  MPI_Request receive = MPI_REQUEST_NULL, transmit = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(recv, n, MPI_FLOAT, previous, kRingTag, comm_, &receive), "MPI_Irecv");
  const int rc = MPI_Isend(send, n, MPI_FLOAT, next, kRingTag, comm_, &transmit);
  if (rc != MPI_SUCCESS) {
    MPI_Cancel(&receive);
    MPI_Request_free(&receive);
    check_mpi(rc, "MPI_Isend");
  }
  wait_for(receive, "MPI_Irecv");
  wait_for(transmit, "MPI_Isend");
}

int MpiCommunicator::group_rank_of_world_rank(int64_t peer) const {
  const auto found = std::find(world_ranks_.begin(), world_ranks_.end(), peer);
  if (found == world_ranks_.end()) {
    std::string members;
    for (int64_t member : world_ranks_) {
      members += (members.empty() ? "" : ", ") + std::to_string(member);
    }
    throw Error(ErrorCode::kInternal, name_ + ": world rank " + std::to_string(peer) +
                                          " is not a member of this group (world ranks " + members +
                                          ")");
  }
  return static_cast<int>(found - world_ranks_.begin());
}

int MpiCommunicator::checked_tag(int64_t tag) const {
  if (tag < 0 || tag > tag_upper_bound_) {
    throw Error(ErrorCode::kInternal, name_ + ": tag " + std::to_string(tag) +
                                          " is outside MPI's range [0, " +
                                          std::to_string(tag_upper_bound_) + "]");
  }
  return static_cast<int>(tag);
}

std::unique_ptr<TransferRequest> MpiCommunicator::start_send(const float* data, int64_t count,
                                                             int64_t peer, int64_t tag) {
  const int n = count_as_int(count, "send");
  const int dest = group_rank_of_world_rank(peer);
  const int mpi_tag = checked_tag(tag);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, n, MPI_FLOAT, dest, mpi_tag, comm_, &request), "MPI_Isend");
  return std::make_unique<MpiTransferRequest>(request);
}

std::unique_ptr<TransferRequest> MpiCommunicator::start_recv(float* data, int64_t count,
                                                             int64_t peer, int64_t tag) {
  const int n = count_as_int(count, "receive");
  const int source = group_rank_of_world_rank(peer);
  const int mpi_tag = checked_tag(tag);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(data, n, MPI_FLOAT, source, mpi_tag, comm_, &request), "MPI_Irecv");
  return std::make_unique<MpiTransferRequest>(request);
}

}  // namespace dhelix::rt
