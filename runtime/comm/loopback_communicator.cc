#include "runtime/comm/loopback_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

// One group's rendezvous: staged inputs and a generation-counted barrier.
struct Group {
  explicit Group(int64_t n)
      : size(n),
        staged(static_cast<size_t>(n)),
        staged_values(static_cast<size_t>(n)),
        staged_counts(static_cast<size_t>(n)) {}
  const int64_t size;
  std::mutex mutex;
  std::condition_variable changed;
  int64_t arrived = 0;
  int64_t generation = 0;
  std::vector<std::vector<float>> staged;
  std::vector<int64_t> staged_values;         // all_reduce_max
  std::vector<const int64_t*> staged_counts;  // all_to_all_v: each member's send_counts
  // ring_exchange: messages by (sender, receiver) group rank, in sending order. Per group,
  // so that the rings of two streams' communicators never mix.
  std::map<std::pair<int64_t, int64_t>, std::deque<std::vector<float>>> ring;

  void barrier(std::unique_lock<std::mutex>& lock) {
    const int64_t mine = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return;
    }
    changed.wait(lock, [&] { return generation != mine; });
  }
};

using MessageKey = std::tuple<int64_t, int64_t, int64_t>;  // sender, receiver, tag

struct Mailbox {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<MessageKey, std::deque<std::vector<float>>> messages;
};

class Done final : public TransferRequest {
 public:
  void wait() override {}
};

class Receive final : public TransferRequest {
 public:
  Receive(std::shared_ptr<Mailbox> box, MessageKey key, float* data, int64_t count)
      : box_(std::move(box)), key_(key), data_(data), count_(count) {}
  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(box_->mutex);
    box_->arrived.wait(lock, [&] {
      const auto it = box_->messages.find(key_);
      return it != box_->messages.end() && !it->second.empty();
    });
    std::deque<std::vector<float>>& queue = box_->messages[key_];
    std::vector<float> message = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    if (static_cast<int64_t>(message.size()) != count_) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("loopback: rank {} sent {} elements with tag {}, rank {} expects {}",
                              std::get<0>(key_), message.size(), std::get<2>(key_),
                              std::get<1>(key_), count_));
    }
    std::copy(message.begin(), message.end(), data_);
    done_ = true;
  }

 private:
  std::shared_ptr<Mailbox> box_;
  MessageKey key_;
  float* data_;
  int64_t count_;
  bool done_ = false;
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(std::shared_ptr<Group> group, std::shared_ptr<Mailbox> box, int64_t rank,
                       int64_t world_rank, std::string name)
      : group_(std::move(group)),
        box_(std::move(box)),
        rank_(rank),
        world_rank_(world_rank),
        name_(std::move(name)) {}

  int64_t size() const override { return group_->size; }
  int64_t rank() const override { return rank_; }
  const std::string& name() const override { return name_; }

  void all_gather(const float* in, int64_t count, float* out) override {
    collective(in, count, [&](const std::vector<std::vector<float>>& staged) {
      for (const std::vector<float>& block : staged)
        out = std::copy(block.begin(), block.end(), out);
    });
  }

  void reduce_scatter_sum(const float* in, int64_t count, float* out) override {
    collective(in, count * size(), [&](const std::vector<std::vector<float>>& staged) {
      const size_t begin = static_cast<size_t>(rank_ * count);
      sum_in_rank_order(staged, begin, count, out);
    });
  }

  void all_reduce_sum(float* inout, int64_t count) override {
    collective(inout, count, [&](const std::vector<std::vector<float>>& staged) {
      sum_in_rank_order(staged, 0, count, inout);
    });
  }

  void barrier() override {
    std::unique_lock<std::mutex> lock(group_->mutex);
    group_->barrier(lock);
  }

  int64_t all_reduce_max(int64_t value) override {
    std::unique_lock<std::mutex> lock(group_->mutex);
    group_->staged_values[static_cast<size_t>(rank_)] = value;
    group_->barrier(lock);
    const int64_t largest =
        *std::max_element(group_->staged_values.begin(), group_->staged_values.end());
    group_->barrier(lock);  // nobody stages the next value before every member has read
    return largest;
  }

  // Every member stages its whole input and its counts; each then copies its own block out
  // of every member's input, in group-rank order.
  void all_to_all_v(const float* in, const int64_t* send_counts, int64_t chunks, float* out,
                    int64_t* recv_counts, int64_t out_capacity) override {
    DHELIX_CHECK(chunks >= 1);
    const int64_t n = size();
    int64_t total_in = 0;
    for (int64_t i = 0; i < n * chunks; ++i) total_in += send_counts[i];
    std::unique_ptr<Error> failure;
    {
      std::unique_lock<std::mutex> lock(group_->mutex);
      group_->staged[static_cast<size_t>(rank_)].assign(in, in + total_in);
      group_->staged_counts[static_cast<size_t>(rank_)] = send_counts;
      group_->barrier(lock);
    }
    // Where member j's block for this rank starts in its input, and its size.
    std::vector<int64_t> offset(static_cast<size_t>(n), 0), block(static_cast<size_t>(n), 0);
    int64_t received = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t* counts = group_->staged_counts[static_cast<size_t>(j)];
      for (int64_t i = 0; i < rank_ * chunks; ++i) offset[static_cast<size_t>(j)] += counts[i];
      for (int64_t c = 0; c < chunks; ++c) {
        recv_counts[j * chunks + c] = counts[rank_ * chunks + c];
        block[static_cast<size_t>(j)] += counts[rank_ * chunks + c];
      }
      received += block[static_cast<size_t>(j)];
    }
    if (received > out_capacity) {
      failure = std::make_unique<Error>(
          ErrorCode::kInternal,
          fmt::format("{}: all_to_all_v receives {} elements into a buffer of {}", name_, received,
                      out_capacity));
    } else {
      float* at = out;
      for (int64_t j = 0; j < n; ++j) {
        const float* source =
            group_->staged[static_cast<size_t>(j)].data() + offset[static_cast<size_t>(j)];
        at = std::copy(source, source + block[static_cast<size_t>(j)], at);
      }
    }
    {
      std::unique_lock<std::mutex> lock(group_->mutex);
      group_->barrier(lock);  // nobody restages before every member has copied
    }
    if (failure) throw *failure;
  }

  // Buffered like the sends below: the message is queued, then the previous member's is
  // awaited.
  void ring_exchange(const float* send, float* recv, int64_t count) override {
    const int64_t n = size();
    std::unique_lock<std::mutex> lock(group_->mutex);
    group_->ring[{rank_, (rank_ + 1) % n}].emplace_back(send, send + count);
    group_->changed.notify_all();
    std::deque<std::vector<float>>& inbox = group_->ring[{(rank_ + n - 1) % n, rank_}];
    group_->changed.wait(lock, [&] { return !inbox.empty(); });
    std::vector<float> message = std::move(inbox.front());
    inbox.pop_front();
    lock.unlock();
    if (static_cast<int64_t>(message.size()) != count) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("loopback: {}: ring_exchange of {} elements met one of {}", name_,
                              count, message.size()));
    }
    std::copy(message.begin(), message.end(), recv);
  }

  std::unique_ptr<TransferRequest> start_send(const float* data, int64_t count, int64_t peer,
                                              int64_t tag) override {
    {
      std::lock_guard<std::mutex> lock(box_->mutex);
      box_->messages[{world_rank_, peer, tag}].emplace_back(data, data + count);
    }
    box_->arrived.notify_all();
    return std::make_unique<Done>();
  }

  std::unique_ptr<TransferRequest> start_recv(float* data, int64_t count, int64_t peer,
                                              int64_t tag) override {
    return std::make_unique<Receive>(box_, MessageKey{peer, world_rank_, tag}, data, count);
  }

 private:
  // out[i] = staged[0][begin + i] + staged[1][begin + i] + ..., left to right.
  static void sum_in_rank_order(const std::vector<std::vector<float>>& staged, size_t begin,
                                int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i) {
      float sum = staged[0][begin + static_cast<size_t>(i)];
      for (size_t r = 1; r < staged.size(); ++r) sum += staged[r][begin + static_cast<size_t>(i)];
      out[i] = sum;
    }
  }

  template <class Compute>
  void collective(const float* in, int64_t count, Compute&& compute) {
    std::unique_lock<std::mutex> lock(group_->mutex);
    group_->staged[static_cast<size_t>(rank_)].assign(in, in + count);
    group_->barrier(lock);
    lock.unlock();
    compute(group_->staged);  // staged is only read until the next barrier
    lock.lock();
    group_->barrier(lock);
  }

  std::shared_ptr<Group> group_;
  std::shared_ptr<Mailbox> box_;
  int64_t rank_;
  int64_t world_rank_;
  std::string name_;
};

}  // namespace

struct LoopbackWorld::State {
  int64_t size = 1;
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<Group>> groups;
  std::shared_ptr<Mailbox> mailbox = std::make_shared<Mailbox>();
};

LoopbackWorld::LoopbackWorld(int64_t size) : state_(std::make_shared<State>()) {
  DHELIX_CHECK(size >= 1);
  state_->size = size;
}

LoopbackWorld::~LoopbackWorld() = default;

int64_t LoopbackWorld::size() const { return state_->size; }

std::unique_ptr<Communicator> LoopbackWorld::communicator(const std::string& key,
                                                          const std::vector<int64_t>& members,
                                                          int64_t rank, const std::string& name) {
  const auto at = std::find(members.begin(), members.end(), rank);
  DHELIX_CHECK_MSG(at != members.end(), "a rank joins only its own groups");
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::shared_ptr<Group>& slot = state_->groups[key];
    if (!slot) slot = std::make_shared<Group>(static_cast<int64_t>(members.size()));
    DHELIX_CHECK(slot->size == static_cast<int64_t>(members.size()));
    group = slot;
  }
  return std::make_unique<LoopbackCommunicator>(group, state_->mailbox, at - members.begin(), rank,
                                                name);
}

}  // namespace dhelix::rt
