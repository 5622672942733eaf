#include "planner/baseline_schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

void check_sizes(const char* what, int64_t pp, int64_t m) {
  if (pp < 1 || m < 1) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("{} schedule: pp = {} and micro-batches = {} must both be >= 1", what, pp, m));
  }
}

PipelineTask forward(int64_t mb, ChunkSide chunk, int64_t model_chunk = 0) {
  PipelineTask t;
  t.kind = TaskKind::kForward;
  t.forward_micro_batch = mb;
  t.forward_chunk = chunk;
  t.forward_model_chunk = model_chunk;
  return t;
}

PipelineTask backward(int64_t mb, ChunkSide chunk, BackwardSplit split, int64_t model_chunk = 0) {
  PipelineTask t;
  t.kind = TaskKind::kBackward;
  t.backward_micro_batch = mb;
  t.backward_chunk = chunk;
  t.backward_model_chunk = model_chunk;
  t.backward_split = split;
  return t;
}

PipelineTask head_loss(int64_t mb, ChunkSide chunk, int64_t model_chunk = 0) {
  PipelineTask t;
  t.kind = TaskKind::kHeadLoss;
  t.forward_micro_batch = mb;
  t.backward_micro_batch = mb;
  t.forward_chunk = chunk;
  t.backward_chunk = chunk;
  t.forward_model_chunk = model_chunk;
  t.backward_model_chunk = model_chunk;
  return t;
}

PipelineSchedule empty_schedule(PipelineShape shape, int64_t pp, int64_t m) {
  PipelineSchedule s;
  s.shape = shape;
  s.pp = pp;
  s.num_micro_batches = m;
  s.embedding_stage = 0;
  const bool folded = folded_shape(shape);
  s.head_loss_stage = folded ? 0 : pp - 1;
  s.first_chunk = folded ? ChunkSide::kDown : ChunkSide::kWhole;
  s.last_chunk = folded ? ChunkSide::kUp : ChunkSide::kWhole;
  s.stages.resize(static_cast<size_t>(pp));
  return s;
}

// ----- interleaved 1F1B -------------------------------------------------------------------

// Micro-batch and model chunk of virtual forward (or backward) number k (the file comment).
std::pair<int64_t, int64_t> interleaved_unit(int64_t k, int64_t pp, int64_t v, bool is_forward) {
  const int64_t in_group = k % (pp * v);
  const int64_t chunk = in_group / pp;
  return {(k / (pp * v)) * pp + in_group % pp, is_forward ? chunk : v - 1 - chunk};
}

std::vector<PipelineTask> interleaved_stage(int64_t pp, int64_t m, int64_t v, int64_t p) {
  const int64_t total = m * v;
  const int64_t warmup = m == pp ? total : std::min(total, (pp - p - 1) * 2 + (v - 1) * pp);
  std::vector<PipelineTask> tasks;
  const auto add_forward = [&](int64_t k) {
    const auto [mb, chunk] = interleaved_unit(k, pp, v, true);
    tasks.push_back(forward(mb, ChunkSide::kWhole, chunk));
    if (p == pp - 1 && chunk == v - 1) tasks.push_back(head_loss(mb, ChunkSide::kWhole, chunk));
  };
  const auto add_backward = [&](int64_t k) {
    const auto [mb, chunk] = interleaved_unit(k, pp, v, false);
    tasks.push_back(backward(mb, ChunkSide::kWhole, BackwardSplit::kWhole, chunk));
  };
  for (int64_t k = 0; k < warmup; ++k) add_forward(k);
  for (int64_t i = 0; i < total - warmup; ++i) {
    add_forward(warmup + i);
    add_backward(i);
  }
  for (int64_t k = total - warmup; k < total; ++k) add_backward(k);
  for (PipelineTask& t : tasks) t.numbered_chunks = true;
  return tasks;
}

// ----- ZB-H1 ------------------------------------------------------------------------------

// Stage p defers its W by p micro-batches (its I runs, its W waits for the p-th next I), so
// that every stage has pp micro-batches in flight, as stage 0 does in 1F1B.
std::vector<PipelineTask> zb_h1_stage(int64_t pp, int64_t m, int64_t p) {
  const bool last = p == pp - 1;
  const int64_t warmup = std::min(pp - 1 - p, m);
  std::vector<PipelineTask> tasks;
  std::deque<int64_t> deferred;
  const auto add_backward = [&](int64_t mb) {
    tasks.push_back(backward(mb, ChunkSide::kWhole, BackwardSplit::kInput));
    deferred.push_back(mb);
    if (static_cast<int64_t>(deferred.size()) > p) {
      tasks.push_back(backward(deferred.front(), ChunkSide::kWhole, BackwardSplit::kWeight));
      deferred.pop_front();
    }
  };
  for (int64_t i = 0; i < warmup; ++i) tasks.push_back(forward(i, ChunkSide::kWhole));
  for (int64_t i = 0; i < m - warmup; ++i) {
    tasks.push_back(forward(warmup + i, ChunkSide::kWhole));
    if (last) tasks.push_back(head_loss(warmup + i, ChunkSide::kWhole));
    add_backward(i);
  }
  for (int64_t i = m - warmup; i < m; ++i) add_backward(i);
  for (int64_t mb : deferred)
    tasks.push_back(backward(mb, ChunkSide::kWhole, BackwardSplit::kWeight));
  return tasks;
}

// ----- ZB-V: the greedy order on chunk times ----------------------------------------------

// A V-shaped greedy run (the header's priority) on the given times: what each stage ran, and
// when every work item ended.
class VGreedy {
 public:
  VGreedy(int64_t pp, int64_t m, std::vector<GreedyStageTimes> times, int64_t max_live)
      : pp_(pp),
        m_(m),
        max_live_(max_live),
        times_(std::move(times)),
        schedule_(empty_schedule(PipelineShape::kV, pp, m)) {
    if (times_.empty()) times_.assign(static_cast<size_t>(pp), GreedyStageTimes{});
    DHELIX_CHECK(static_cast<int64_t>(times_.size()) == pp);
    free_.assign(static_cast<size_t>(pp), 0);
    live_.assign(static_cast<size_t>(pp), 0);
    next_forward_.assign(static_cast<size_t>(2 * pp), 0);
    next_input_.assign(static_cast<size_t>(2 * pp), 0);
    pending_weight_.resize(static_cast<size_t>(pp));
    end_.assign(static_cast<size_t>(pp * 4 * 3 * m), -1.0);
  }

  PipelineSchedule run() {
    const int64_t total = 6 * m_ * pp_;  // F, I, W of two chunks per micro-batch and stage
    int64_t done = 0;
    double t = 0;
    while (done < total) {
      bool progress = false;
      for (int64_t s = 0; s < pp_; ++s) {
        if (free_[static_cast<size_t>(s)] > t) continue;
        if (step(s, t)) {
          done += 1;
          progress = true;
        }
      }
      if (!progress) t = next_event_after(t);
    }
    return std::move(schedule_);
  }

 private:
  using Key = std::tuple<WorkPass, int64_t, ChunkSide, int64_t>;  // pass, mb, chunk, stage

  // The earliest task end or arrival after t (every stage-free time is a task end); none
  // means the order cannot go on.
  double next_event_after(double t) {
    while (!events_.empty() && events_.top() <= t) events_.pop();
    if (events_.empty()) {
      throw Error(ErrorCode::kInternal, "zb-v schedule: the greedy order stalled");
    }
    return events_.top();
  }

  // Whether `key`'s result is on stage `at` by time t (a transfer from another stage adds the
  // sender's p2p time).
  bool arrived(const Key& key, int64_t at, double t) const {
    const double end = end_[index(key)];
    if (end < 0) return false;
    const int64_t from = std::get<3>(key);
    const double p2p = from == at ? 0.0 : times_[static_cast<size_t>(from)].p2p_us;
    return end + p2p <= t;
  }

  // Position of a work item's end time in end_ (stage, pass, chunk side, micro-batch).
  size_t index(const Key& key) const {
    const auto [pass, mb, chunk, stage] = key;
    return static_cast<size_t>(
        ((stage * 4 + static_cast<int64_t>(pass)) * 3 + static_cast<int64_t>(chunk)) * m_ + mb);
  }

  bool forward_ready(int64_t s, ChunkSide c, int64_t mb, double t) const {
    if (c == ChunkSide::kDown) return s == 0 || arrived({WorkPass::kForward, mb, c, s - 1}, s, t);
    if (s == pp_ - 1) return arrived({WorkPass::kForward, mb, ChunkSide::kDown, s}, s, t);
    return arrived({WorkPass::kForward, mb, ChunkSide::kUp, s + 1}, s, t);
  }

  bool input_ready(int64_t s, ChunkSide c, int64_t mb, double t) const {
    if (!arrived({WorkPass::kForward, mb, c, s}, s, t)) return false;
    if (c == ChunkSide::kUp) {
      return s == 0 ? arrived({WorkPass::kHeadLoss, mb, c, 0}, s, t)
                    : arrived({WorkPass::kBackward, mb, c, s - 1}, s, t);
    }
    if (s == pp_ - 1) return arrived({WorkPass::kBackward, mb, ChunkSide::kUp, s}, s, t);
    return arrived({WorkPass::kBackward, mb, c, s + 1}, s, t);
  }

  void emit(int64_t s, const PipelineTask& task, const Key& key, double t, double duration) {
    schedule_.stages[static_cast<size_t>(s)].push_back(task);
    const double end = std::max(t, free_[static_cast<size_t>(s)]) + duration;
    end_[index(key)] = end;
    events_.push(end);
    events_.push(end + times_[static_cast<size_t>(s)].p2p_us);
    free_[static_cast<size_t>(s)] = end;
  }

  static size_t side(int64_t s, ChunkSide c) {
    return static_cast<size_t>(2 * s + (c == ChunkSide::kUp ? 1 : 0));
  }

  // Runs the stage's highest-priority ready task at time t (the header's order).
  bool step(int64_t s, double t) {
    const auto si = static_cast<size_t>(s);
    const GreedyStageTimes& time = times_[si];
    const bool room = live_[si] < max_live_;
    int64_t& up_f = next_forward_[side(s, ChunkSide::kUp)];
    const auto run_up_forward = [&] {
      emit(s, forward(up_f, ChunkSide::kUp), {WorkPass::kForward, up_f, ChunkSide::kUp, s}, t,
           time.forward_up_us);
      live_[si] += 1;
      if (s == 0) {
        emit(s, head_loss(up_f, ChunkSide::kUp), {WorkPass::kHeadLoss, up_f, ChunkSide::kUp, 0}, t,
             time.head_loss_us);
      }
      up_f += 1;
      return true;
    };
    const bool up_ready = up_f < m_ && forward_ready(s, ChunkSide::kUp, up_f, t);
    if (room && up_ready) return run_up_forward();
    for (ChunkSide c : {ChunkSide::kUp, ChunkSide::kDown}) {
      int64_t& mb = next_input_[side(s, c)];
      if (mb < m_ && input_ready(s, c, mb, t)) {
        emit(s, backward(mb, c, BackwardSplit::kInput), {WorkPass::kBackward, mb, c, s}, t,
             c == ChunkSide::kUp ? time.input_up_us : time.input_down_us);
        pending_weight_[si].emplace_back(mb, c);
        mb += 1;
        return true;
      }
    }
    if (!pending_weight_[si].empty()) {
      const auto [mb, c] = pending_weight_[si].front();
      pending_weight_[si].pop_front();
      emit(s, backward(mb, c, BackwardSplit::kWeight), {WorkPass::kWeightGrad, mb, c, s}, t,
           c == ChunkSide::kUp ? time.weight_up_us : time.weight_down_us);
      live_[si] -= 1;
      return true;
    }
    int64_t& down_f = next_forward_[side(s, ChunkSide::kDown)];
    if (room && down_f < m_ && forward_ready(s, ChunkSide::kDown, down_f, t)) {
      emit(s, forward(down_f, ChunkSide::kDown), {WorkPass::kForward, down_f, ChunkSide::kDown, s},
           t, time.forward_down_us);
      live_[si] += 1;
      down_f += 1;
      return true;
    }
    // Nothing else can run: an up-chunk forward completes a micro-batch whose down chunk
    // already holds memory here; holding it back for room could deadlock.
    if (up_ready) return run_up_forward();
    return false;
  }

  int64_t pp_;
  int64_t m_;
  int64_t max_live_;  // chunk activations a down-chunk forward may find live
  std::vector<GreedyStageTimes> times_;
  PipelineSchedule schedule_;
  std::vector<double> end_;  // by index(); -1: not run yet
  // Task ends and arrivals (ends plus the p2p time), earliest first.
  std::priority_queue<double, std::vector<double>, std::greater<>> events_;
  std::vector<int64_t> next_forward_;  // per stage and side (side())
  std::vector<int64_t> next_input_;
  std::vector<double> free_;
  std::vector<int64_t> live_;  // chunk activations held (forward started, W not yet run)
  std::vector<std::deque<std::pair<int64_t, ChunkSide>>> pending_weight_;
};

// ----- DualPipeV ----------------------------------------------------------------------------

// One rank's task list, built by DeepSeek's eight steps (the header). Chunk 0 is the down
// chunk, chunk 1 the up chunk; each chunk's forwards and backwards run micro-batches in order.
class DualPipeVRank {
 public:
  DualPipeVRank(int64_t n, int64_t m, int64_t r) : n_(n), m_(m), r_(r) {}

  std::vector<PipelineTask> build() {
    const int64_t n = n_, r = r_;
    for (int64_t i = 0; i < 2 * (n - r - 1); ++i) add_forward(kDown);  // 1
    for (int64_t i = 0; i < r + 1; ++i) {                              // 2
      add_forward(kDown);
      add_forward(kUp);
    }
    for (int64_t i = 0; i < n - r - 1; ++i) {  // 3
      add_backward(kUp, true);
      add_weight();
      add_forward(kUp);
    }
    const int64_t main_steps = m_ - 2 * n + r + 1;  // 4
    for (int64_t i = 0; i < main_steps; ++i) {
      if (i == 0 && r == n - 1) {
        add_forward(kDown);
        add_backward(kUp, false);
      } else {
        add_pair(kDown, kUp);
      }
      add_pair(kUp, kDown);
    }
    for (int64_t i = 0; i < n - r - 1; ++i) {  // 5
      add_backward(kUp, false);
      add_pair(kUp, kDown);
    }
    bool split = false;  // 6: the second half of these backwards split off their W
    for (int64_t i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      add_backward(kUp, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      add_backward(kDown, split);
    }
    for (int64_t i = 0; i < n - r - 1; ++i) {  // 7
      add_weight();
      add_backward(kDown, true);
    }
    for (int64_t i = 0; i < r + 1; ++i) add_weight();  // 8
    return std::move(tasks_);
  }

 private:
  static constexpr ChunkSide kDown = ChunkSide::kDown;
  static constexpr ChunkSide kUp = ChunkSide::kUp;

  int64_t& next_forward(ChunkSide c) { return c == kDown ? forward_down_ : forward_up_; }
  int64_t& next_backward(ChunkSide c) { return c == kDown ? backward_down_ : backward_up_; }

  void add_head_loss_after(const PipelineTask& task) {
    if (r_ == 0 && task.has_forward() && task.forward_chunk == kUp) {
      tasks_.push_back(head_loss(task.forward_micro_batch, kUp));
    }
  }

  void add_forward(ChunkSide c) {
    tasks_.push_back(forward(next_forward(c)++, c));
    add_head_loss_after(tasks_.back());
  }

  void add_backward(ChunkSide c, bool split) {
    const int64_t mb = next_backward(c)++;
    tasks_.push_back(backward(mb, c, split ? BackwardSplit::kInput : BackwardSplit::kWhole));
    if (split) pending_weight_.emplace_back(mb, c);
  }

  void add_weight() {
    DHELIX_CHECK(!pending_weight_.empty());
    const auto [mb, c] = pending_weight_.front();
    pending_weight_.pop_front();
    tasks_.push_back(backward(mb, c, BackwardSplit::kWeight));
  }

  // Forward of chunk f overlapped with the whole backward of chunk b: an SI block.
  void add_pair(ChunkSide f, ChunkSide b) {
    PipelineTask task = forward(next_forward(f)++, f);
    task.kind = TaskKind::kSiBlock;
    task.backward_micro_batch = next_backward(b)++;
    task.backward_chunk = b;
    tasks_.push_back(task);
    add_head_loss_after(task);
  }

  int64_t n_, m_, r_;
  int64_t forward_down_ = 0, forward_up_ = 0, backward_down_ = 0, backward_up_ = 0;
  std::deque<std::pair<int64_t, ChunkSide>> pending_weight_;
  std::vector<PipelineTask> tasks_;
};

}  // namespace

PipelineSchedule make_interleaved_schedule(int64_t pp, int64_t num_micro_batches, int64_t v) {
  check_sizes("interleaved 1F1B", pp, num_micro_batches);
  if (v == 1) return make_one_f_one_b_schedule(pp, num_micro_batches);  // Megatron's choice too
  if (v < 1 || num_micro_batches % pp != 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("interleaved 1F1B schedule: virtual pipeline size {} must be >= 1 "
                            "and micro-batches = {} a multiple of pp = {} (as Megatron requires)",
                            v, num_micro_batches, pp));
  }
  PipelineSchedule s = empty_schedule(PipelineShape::kInterleaved, pp, num_micro_batches);
  s.model_chunks = v;
  for (int64_t p = 0; p < pp; ++p) {
    s.stages[static_cast<size_t>(p)] = interleaved_stage(pp, num_micro_batches, v, p);
  }
  return s;
}

PipelineSchedule make_zb_h1_schedule(int64_t pp, int64_t num_micro_batches) {
  check_sizes("zb-h1", pp, num_micro_batches);
  PipelineSchedule s = empty_schedule(PipelineShape::kOneFOneB, pp, num_micro_batches);
  for (int64_t p = 0; p < pp; ++p) {
    s.stages[static_cast<size_t>(p)] = zb_h1_stage(pp, num_micro_batches, p);
  }
  return s;
}

PipelineSchedule make_zb_v_schedule(int64_t pp, int64_t num_micro_batches,
                                    const std::vector<GreedyStageTimes>& times,
                                    int64_t extra_chunks) {
  check_sizes("zb-v", pp, num_micro_batches);
  if (extra_chunks < 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("zb-v schedule: extra chunks {} must be >= 0", extra_chunks));
  }
  if (!times.empty() && static_cast<int64_t>(times.size()) != pp) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("zb-v schedule: {} stage times for pp = {}", times.size(), pp));
  }
  return VGreedy(pp, num_micro_batches, times, 2 * pp + extra_chunks).run();
}

bool dualpipev_applies(int64_t pp, int64_t num_micro_batches) {
  return pp >= 1 && num_micro_batches >= 2 * pp;
}

PipelineSchedule make_dualpipev_schedule(int64_t pp, int64_t num_micro_batches) {
  check_sizes("dualpipev", pp, num_micro_batches);
  if (!dualpipev_applies(pp, num_micro_batches)) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("dualpipev schedule: {} micro-batches on {} ranks; DualPipeV needs "
                            "at least 2·pp = {}",
                            num_micro_batches, pp, 2 * pp));
  }
  PipelineSchedule s = empty_schedule(PipelineShape::kV, pp, num_micro_batches);
  for (int64_t r = 0; r < pp; ++r) {
    s.stages[static_cast<size_t>(r)] = DualPipeVRank(pp, num_micro_batches, r).build();
  }
  return s;
}

int64_t default_virtual_pipeline_size(int64_t layers_per_stage, int64_t pp,
                                      int64_t num_micro_batches) {
  if (pp < 2 || layers_per_stage < 1 || num_micro_batches < pp || num_micro_batches % pp != 0) {
    return 1;
  }
  for (int64_t v = std::min(layers_per_stage, kDefaultMaxVirtualPipelineSize); v > 1; --v) {
    if (layers_per_stage % v == 0) return v;
  }
  return 1;
}

}  // namespace dhelix
