#include "runtime/comm/emulated_link.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lib/error.h"
#include "lib/link_cost.h"

namespace dhelix::rt {
namespace {

constexpr size_t kFloat = sizeof(float);
// The send's start as nanoseconds of LinkClock, carried in the payload's type.
constexpr int64_t kHeaderFloats = sizeof(int64_t) / kFloat;

void set_fine_timer_slack() {
  thread_local bool set = false;
  if (set) return;
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  set = true;
}

// A send: the header and the payload in flight; wait() returns when both left and the link
// has carried the payload.
class EmulatedSend final : public TransferRequest {
 public:
  EmulatedSend(std::unique_ptr<int64_t> header, std::unique_ptr<TransferRequest> header_request,
               std::unique_ptr<TransferRequest> payload, EmulatedLink& link,
               LinkClock::time_point done)
      : header_(std::move(header)),
        header_request_(std::move(header_request)),
        payload_(std::move(payload)),
        link_(link),
        done_(done) {}
  void wait() override {
    header_request_->wait();
    payload_->wait();
    sleep_until_deadline(done_);
    link_.record_return(done_, LinkClock::now());
  }

 private:
  std::unique_ptr<int64_t> header_;  // read by the header send until it completes
  std::unique_ptr<TransferRequest> header_request_;
  std::unique_ptr<TransferRequest> payload_;
  EmulatedLink& link_;
  LinkClock::time_point done_;
};

// A receive: completes when the payload is here and the link would have delivered it,
// from the sender's start (the header) through this rank's ingress.
class EmulatedReceive final : public TransferRequest {
 public:
  EmulatedReceive(std::unique_ptr<int64_t> header, std::unique_ptr<TransferRequest> header_request,
                  std::unique_ptr<TransferRequest> payload, EmulatedLink& link,
                  std::chrono::nanoseconds duration)
      : header_(std::move(header)),
        header_request_(std::move(header_request)),
        payload_(std::move(payload)),
        link_(link),
        duration_(duration) {}
  void wait() override {
    if (finished_) return;
    header_request_->wait();
    payload_->wait();
    const LinkClock::time_point sent{std::chrono::nanoseconds(*header_)};
    const LinkClock::time_point done =
        link_.reserve(sent, duration_, /*egress=*/false, /*ingress=*/true);
    sleep_until_deadline(done);
    link_.record_return(done, LinkClock::now());
    finished_ = true;
  }

 private:
  std::unique_ptr<int64_t> header_;
  std::unique_ptr<TransferRequest> header_request_;
  std::unique_ptr<TransferRequest> payload_;
  EmulatedLink& link_;
  std::chrono::nanoseconds duration_;
  bool finished_ = false;
};

}  // namespace

void sleep_until_deadline(LinkClock::time_point deadline) {
  set_fine_timer_slack();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
  if (ns.count() <= 0) return;
  timespec when{};
  when.tv_sec = static_cast<time_t>(ns.count() / 1'000'000'000);
  when.tv_nsec = static_cast<long>(ns.count() % 1'000'000'000);
  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++), so the deadline is on that clock.
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &when, nullptr) == EINTR) {
  }
}

std::chrono::nanoseconds EmulatedLink::duration(OpKind kind, int64_t n, double bytes) const {
  const double us = link_time_us(kind, n, bytes, rate_.bus_bandwidth_gbps, rate_.latency_us);
  return std::chrono::nanoseconds(static_cast<int64_t>(us * 1e3 + 0.5));
}

LinkClock::time_point EmulatedLink::reserve(LinkClock::time_point ready,
                                            std::chrono::nanoseconds duration, bool egress,
                                            bool ingress) {
  const std::lock_guard lock(mutex_);
  LinkClock::time_point start = ready;
  if (egress) start = std::max(start, egress_free_);
  if (ingress) start = std::max(start, ingress_free_);
  const LinkClock::time_point done = start + duration;
  if (egress) egress_free_ = done;
  if (ingress) ingress_free_ = done;
  return done;
}

void EmulatedLink::record_return(LinkClock::time_point done, LinkClock::time_point returned) {
  const double late_ms = std::chrono::duration<double, std::milli>(returned - done).count();
  const std::lock_guard lock(mutex_);
  ++lateness_.transfers;
  if (returned - done <= kLateReturn) return;
  ++lateness_.late;
  lateness_.late_ms += late_ms;
  lateness_.max_late_ms = std::max(lateness_.max_late_ms, late_ms);
}

LinkLateness EmulatedLink::lateness() const {
  const std::lock_guard lock(mutex_);
  return lateness_;
}

std::string lateness_text(const std::vector<std::pair<ParallelDim, LinkLateness>>& links) {
  if (links.empty()) return "";
  LinkLateness all;
  for (const auto& [kind, l] : links) {
    all.transfers += l.transfers;
    all.late += l.late;
    all.late_ms += l.late_ms;
    all.max_late_ms = std::max(all.max_late_ms, l.max_late_ms);
  }
  const std::string calls = fmt::format("{} call{}", all.transfers, all.transfers == 1 ? "" : "s");
  if (all.late == 0) {
    return fmt::format("{}, none returned more than {} us after its link", calls,
                       kLateReturn.count());
  }
  return fmt::format(
      "{}, {} returned more than {} us after its link ({:.1f} ms in all, the latest {:.1f} ms)",
      calls, all.late, kLateReturn.count(), all.late_ms, all.max_late_ms);
}

OrderedJson lateness_to_json(const std::vector<std::pair<ParallelDim, LinkLateness>>& links) {
  OrderedJson json = OrderedJson::object();
  for (const auto& [kind, l] : links) {
    json[std::string(parallel_dim_name(kind))] = {{"calls", l.transfers},
                                                  {"late", l.late},
                                                  {"late_ms", l.late_ms},
                                                  {"max_late_ms", l.max_late_ms},
                                                  {"late_threshold_us", kLateReturn.count()}};
  }
  return json;
}

EmulatedLinkCommunicator::EmulatedLinkCommunicator(Communicator& inner, EmulatedLink* collectives,
                                                   EmulatedLink* transfers)
    : inner_(inner), collectives_(collectives), transfers_(transfers) {}

LinkClock::time_point EmulatedLinkCommunicator::last_arrival(LinkClock::time_point mine) {
  // Every member's call time, gathered as the int64 nanoseconds of the shared clock.
  const int64_t own =
      std::chrono::duration_cast<std::chrono::nanoseconds>(mine.time_since_epoch()).count();
  arrivals_.assign(static_cast<size_t>(inner_.size()), 0);
  inner_.all_gather(reinterpret_cast<const float*>(&own), kHeaderFloats,
                    reinterpret_cast<float*>(arrivals_.data()));
  return LinkClock::time_point{
      std::chrono::nanoseconds(*std::max_element(arrivals_.begin(), arrivals_.end()))};
}

template <typename Exchange>
void EmulatedLinkCommunicator::run_collective(OpKind kind, Exchange exchange) {
  if (collectives_ == nullptr || inner_.size() <= 1) {
    exchange();
    return;
  }
  const LinkClock::time_point ready = last_arrival(LinkClock::now());
  const double bytes = exchange();
  const std::chrono::nanoseconds duration = collectives_->duration(kind, inner_.size(), bytes);
  const LinkClock::time_point done =
      collectives_->reserve(ready, duration, /*egress=*/true, /*ingress=*/true);
  sleep_until_deadline(done);
  collectives_->record_return(done, LinkClock::now());
}

void EmulatedLinkCommunicator::all_gather(const float* in, int64_t count, float* out) {
  run_collective(OpKind::kAllGather, [&] {
    inner_.all_gather(in, count, out);
    return static_cast<double>(size() * count * kFloat);  // S: the gathered buffer
  });
}

void EmulatedLinkCommunicator::reduce_scatter_sum(const float* in, int64_t count, float* out) {
  run_collective(OpKind::kReduceScatter, [&] {
    inner_.reduce_scatter_sum(in, count, out);
    return static_cast<double>(size() * count * kFloat);  // S: the input, n blocks
  });
}

void EmulatedLinkCommunicator::all_reduce_sum(float* inout, int64_t count) {
  run_collective(OpKind::kAllReduce, [&] {
    inner_.all_reduce_sum(inout, count);
    return static_cast<double>(count * kFloat);
  });
}

void EmulatedLinkCommunicator::ring_exchange(const float* send, float* recv, int64_t count) {
  // One send to the next member and one receive from the previous one: a send/recv of S.
  run_collective(OpKind::kSendRecv, [&] {
    inner_.ring_exchange(send, recv, count);
    return static_cast<double>(count * kFloat);
  });
}

void EmulatedLinkCommunicator::all_to_all_v(const float* in, const int64_t* send_counts,
                                            int64_t chunks, float* out, int64_t* recv_counts,
                                            int64_t out_capacity) {
  // What crosses the link: the blocks for and from the other members; the busier
  // direction sets the time. (n-1)/n · S of lib/link_cost.h is that, so S = busier · n/(n-1).
  // The receive counts are known after the exchange, so the link is priced after it.
  run_collective(OpKind::kAllToAll, [&] {
    inner_.all_to_all_v(in, send_counts, chunks, out, recv_counts, out_capacity);
    const int64_t n = size();
    int64_t sent = 0, received = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j == rank()) continue;
      for (int64_t c = 0; c < chunks; ++c) {
        sent += send_counts[j * chunks + c];
        received += recv_counts[j * chunks + c];
      }
    }
    const double busier = static_cast<double>(std::max(sent, received) * kFloat);
    return n > 1 ? busier * static_cast<double>(n) / static_cast<double>(n - 1) : 0.0;
  });
}

std::unique_ptr<TransferRequest> EmulatedLinkCommunicator::start_send(const float* data,
                                                                      int64_t count, int64_t peer,
                                                                      int64_t tag) {
  if (transfers_ == nullptr) return inner_.start_send(data, count, peer, tag);
  const std::chrono::nanoseconds duration =
      transfers_->duration(OpKind::kSendRecv, 2, static_cast<double>(count * kFloat));
  const LinkClock::time_point done =
      transfers_->reserve(LinkClock::now(), duration, /*egress=*/true, /*ingress=*/false);
  auto header = std::make_unique<int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>((done - duration).time_since_epoch())
          .count());
  // The header first, on the same tag: MPI keeps two messages of one sender, tag and
  // communicator in order, so the receiver's first receive gets it.
  std::unique_ptr<TransferRequest> header_request =
      inner_.start_send(reinterpret_cast<const float*>(header.get()), kHeaderFloats, peer, tag);
  std::unique_ptr<TransferRequest> payload = inner_.start_send(data, count, peer, tag);
  return std::make_unique<EmulatedSend>(std::move(header), std::move(header_request),
                                        std::move(payload), *transfers_, done);
}

std::unique_ptr<TransferRequest> EmulatedLinkCommunicator::start_recv(float* data, int64_t count,
                                                                      int64_t peer, int64_t tag) {
  if (transfers_ == nullptr) return inner_.start_recv(data, count, peer, tag);
  const std::chrono::nanoseconds duration =
      transfers_->duration(OpKind::kSendRecv, 2, static_cast<double>(count * kFloat));
  auto header = std::make_unique<int64_t>(0);
  std::unique_ptr<TransferRequest> header_request =
      inner_.start_recv(reinterpret_cast<float*>(header.get()), kHeaderFloats, peer, tag);
  std::unique_ptr<TransferRequest> payload = inner_.start_recv(data, count, peer, tag);
  return std::make_unique<EmulatedReceive>(std::move(header), std::move(header_request),
                                           std::move(payload), *transfers_, duration);
}

}  // namespace dhelix::rt
