#pragma once
// A link that costs wire time and no cores: the CPU runtime's stand-in for NVLink or an
// RDMA NIC, whose copy engines move the bytes while the SMs compute. On CPU ranks over
// TCP the network stack is kernel work on the very cores the ranks compute on, so a
// collective beside computation slows both and no run could show communication hidden
// (docs/runtime.md, "The co-execution benchmark"). Here the payload moves through the
// host's MPI transport at once (shared memory) and the call returns when the modelled
// link would have finished the transfer; the thread waits in one absolute-time sleep
// (clock_nanosleep), holding no core.
//
// When a transfer finishes. Each rank has one EmulatedLink per process-group kind (tp, cp,
// ep, dp, pp), shared by every communicator and thread of that kind, with two directions:
// egress (what this rank sends) and ingress (what it receives). A transfer of duration d
// (lib/link_cost.h's link_time_us: the wire bytes of the collective's ring algorithm, as
// the model backend counts them) that may start at `ready` takes each direction it uses
// from max(ready, that direction's previous end) for d, and completes at the later end:
//
//   collective (all-gather, reduce-scatter, all-reduce, all-to-all, ring exchange):
//     ready = the last member's call (a ring cannot move before its last member arrives),
//     learnt from a small all-gather of the members' call times ahead of the payload, so
//     that a communication thread the scheduler wakes late does not delay the link (a
//     DMA engine runs whether or not the CPU looks); both directions. The call returns at
//     the link's completion or when the exchange returned, whichever is later.
//   send:    ready = the call; egress only. The start is sent to the receiver ahead of
//            the payload (a 16-byte header on the same tag).
//   receive: ready = the sender's start; ingress only.
//
// Worked example (rank 0 of a tp-2 link at 2gbit@20us, B = 0.25 GB/s = 250 B/us): an
// all-gather of 512 KiB per rank (S = 1 MiB) whose last member calls at t = 0 ends at
// 20 + 1/2 · 1048576 / 250 = 2117 us; a reduce-scatter of the same S issued from another
// thread at t = 500 us starts when the link is free, at 2117 us, and ends at 4234 us.
//
// Late returns. A call returns when the link is done only if the thread is running then and
// the exchange through shared memory has finished; on a host with fewer cores than
// threads it may return later (the communication thread not scheduled, the peer's not yet
// through MPI's hand-shakes), and the strand waiting on it is held back by the host, not by
// the link. Every link counts its transfers and how late each call returned after the link
// was done (EmulatedLink::lateness); dhelix-run prints rank 0's count in its summary and
// writes it in the trace's metadata, so a run that misses its plan says whether the
// emulation itself ran late.
//
// What is not modelled: barriers, all_reduce_max and the call-time all-gather (control
// traffic, on the real transport), an exchange slower than the link (the call then
// returns when the exchange does: shared memory moves the tiny jobs' megabytes in well
// under their wire time), contention between kinds (each kind has its own link, as NVLink and
// the NIC are separate), and sender/receiver clocks on different hosts (every rank must
// share the host's CLOCK_MONOTONIC; ProcessGroups refuses otherwise).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lib/json_reader.h"
#include "lib/op_catalogue.h"
#include "lib/parallel_spec.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/link_emulation.h"

namespace dhelix::rt {

/// The clock every rank of a host shares (CLOCK_MONOTONIC).
using LinkClock = std::chrono::steady_clock;

/// A return later than this after the link was done counts as late (EmulatedLink::lateness):
/// above a communication thread's wake-up latency here (docs/runtime.md: ~12-30 us).
inline constexpr std::chrono::microseconds kLateReturn{100};

/// How late one link's calls returned after the link was done (see the file comment).
struct LinkLateness {
  int64_t transfers = 0;   ///< calls that ran on the link
  int64_t late = 0;        ///< of which returned more than kLateReturn after it was done
  double late_ms = 0;      ///< their lateness summed, ms
  double max_late_ms = 0;  ///< the latest one's, ms
};

/// Sleeps until `deadline` in one absolute sleep (no polling), with a 1 ns timer slack so
/// that the sleep ends when asked, not up to 50 us later (Linux's default slack).
void sleep_until_deadline(LinkClock::time_point deadline);

/// One rank's link of one group kind (see the file comment). Thread-safe.
class EmulatedLink {
 public:
  explicit EmulatedLink(LinkRate rate) : rate_(std::move(rate)) {}

  const LinkRate& rate() const { return rate_; }
  /// The modelled duration of a `kind` op of `bytes` (S of lib/link_cost.h) over `n` ranks.
  std::chrono::nanoseconds duration(OpKind kind, int64_t n, double bytes) const;
  /// Takes the directions asked for from max(ready, their previous ends) for `duration`
  /// and returns the completion time (the later end).
  LinkClock::time_point reserve(LinkClock::time_point ready, std::chrono::nanoseconds duration,
                                bool egress, bool ingress);
  /// Counts a call that the link had finished at `done` and that returned at `returned`.
  void record_return(LinkClock::time_point done, LinkClock::time_point returned);
  /// The calls counted so far.
  LinkLateness lateness() const;

 private:
  LinkRate rate_;
  mutable std::mutex mutex_;
  LinkLateness lateness_;
  LinkClock::time_point egress_free_{};
  LinkClock::time_point ingress_free_{};
};

/// The links' lateness summed: "9216 calls, 12 returned more than 100 us after its link
/// (3.4 ms in all, the latest 0.9 ms)"; "" for no links.
std::string lateness_text(const std::vector<std::pair<ParallelDim, LinkLateness>>& links);
/// {"tp": {"calls": 9216, "late": 12, "late_ms": 3.4, "max_late_ms": 0.9,
///  "late_threshold_us": 100}, ...}: for a trace's metadata.
OrderedJson lateness_to_json(const std::vector<std::pair<ParallelDim, LinkLateness>>& links);

/// A communicator whose transfers complete on emulated links (see the file comment).
/// `collectives` prices the collectives (null: they run as the inner communicator's),
/// `transfers` the point-to-point sends and receives (null: likewise). The inner
/// communicator and the links must outlive this one.
class EmulatedLinkCommunicator final : public Communicator {
 public:
  EmulatedLinkCommunicator(Communicator& inner, EmulatedLink* collectives, EmulatedLink* transfers);

  int64_t size() const override { return inner_.size(); }
  int64_t rank() const override { return inner_.rank(); }
  const std::string& name() const override { return inner_.name(); }

  void all_gather(const float* in, int64_t count, float* out) override;
  void reduce_scatter_sum(const float* in, int64_t count, float* out) override;
  void all_reduce_sum(float* inout, int64_t count) override;
  void barrier() override { inner_.barrier(); }
  void ring_exchange(const float* send, float* recv, int64_t count) override;
  void all_to_all_v(const float* in, const int64_t* send_counts, int64_t chunks, float* out,
                    int64_t* recv_counts, int64_t out_capacity) override;
  int64_t all_reduce_max(int64_t value) override { return inner_.all_reduce_max(value); }
  std::unique_ptr<TransferRequest> start_send(const float* data, int64_t count, int64_t peer,
                                              int64_t tag) override;
  std::unique_ptr<TransferRequest> start_recv(float* data, int64_t count, int64_t peer,
                                              int64_t tag) override;

  /// The wrapped communicator.
  Communicator& inner() { return inner_; }

 private:
  // The latest of the members' call times (`mine` is this rank's), agreed by an all-gather
  // of the call times ahead of the payload.
  LinkClock::time_point last_arrival(LinkClock::time_point mine);
  // Runs `exchange` (the inner communicator's collective, returning S of lib/link_cost.h in
  // bytes) and returns when the link would have finished it: both directions taken for the
  // op's duration from the last arrival.
  template <typename Exchange>
  void run_collective(OpKind kind, Exchange exchange);

  Communicator& inner_;
  EmulatedLink* collectives_;
  EmulatedLink* transfers_;
  std::vector<int64_t> arrivals_;  // last_arrival's scratch
};

}  // namespace dhelix::rt
