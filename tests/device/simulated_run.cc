#include "tests/device/simulated_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "lib/placement.h"
#include "lib/rank_shape.h"
#include "runtime/comm/process_groups.h"
#include "runtime/cuda/device_executor.h"
#include "runtime/cuda/device_model.h"
#include "runtime/cuda/device_session.h"
#include "runtime/model/stage_model_impl.h"
#include "tests/device/recording_backend.h"

namespace dhelix::rt {
template class BasicStageModel<cuda::testing::RecordingBackend>;
}  // namespace dhelix::rt

namespace dhelix::cuda::testing {
namespace {

using Model = rt::BasicStageModel<RecordingBackend>;

struct World {
  const Plan& plan;
  const JobSpec& job;
  Placement placement;
  // [rank] -> programs of both modes
  std::vector<std::vector<RankProgram>> programs;
};

std::string slot_label(const CollectiveSlot& slot) {
  return fmt::format("{} ({})", parallel_dim_name(slot.dim), device_stream_name(slot.stream));
}

// What DeviceCommDirectory::over_mpi would agree on, from every rank's programs.
DeviceCommPlan agreed_plan(const World& world, const DeviceCommSetup& setup, int64_t rank) {
  DeviceCommPlan plan;
  const auto no_op = [](CommId&) {};
  for (const CollectiveSlot& slot : setup.collectives) {
    const ProcessGroup group = world.placement.group(slot.dim, rank);
    int64_t index = 0;
    while (group.ranks[static_cast<size_t>(index)] != rank) ++index;
    plan.collectives.push_back(
        {.name = fmt::format("{} ranks {}", slot_label(slot), fmt::join(group.ranks, ",")),
         .size = static_cast<int64_t>(group.ranks.size()),
         .rank = index,
         .share_id = no_op});
  }
  if (setup.gradient_group) {
    const std::vector<int64_t> members = rt::dp_cp_members(world.placement, rank);
    const auto at = std::find(members.begin(), members.end(), rank);
    plan.gradient = CommMembership{.name = fmt::format("dp x cp ranks {}", fmt::join(members, ",")),
                                   .size = static_cast<int64_t>(members.size()),
                                   .rank = at - members.begin(),
                                   .share_id = no_op};
  }
  if (setup.expert_gradient_group) {
    const std::vector<int64_t> members =
        rt::ProcessGroups::expert_data_parallel_ranks(world.placement, rank);
    const auto at = std::find(members.begin(), members.end(), rank);
    plan.expert_gradient =
        CommMembership{.name = fmt::format("expert dp ranks {}", fmt::join(members, ",")),
                       .size = static_cast<int64_t>(members.size()),
                       .rank = at - members.begin(),
                       .share_id = no_op};
  }
  std::vector<std::vector<int64_t>> send_peers_by_rank;
  for (const auto& programs : world.programs) {
    std::set<int64_t> peers;
    for (const RankProgram& program : programs) {
      for (int64_t peer : send_peers(channel_messages(program))) peers.insert(peer);
    }
    send_peers_by_rank.emplace_back(peers.begin(), peers.end());
  }
  plan.channels = channel_pairs(send_peers_by_rank);
  for (const ChannelPair& pair : plan.channels) {
    if (pair.sender != rank && pair.receiver != rank) {
      plan.channel_members.emplace_back();
      continue;
    }
    plan.channel_members.push_back(
        CommMembership{.name = fmt::format("pp {}->{}", pair.sender, pair.receiver),
                       .size = 2,
                       .rank = pair.sender == rank ? 0 : 1,
                       .share_id = no_op});
  }
  for (size_t m = 0; m < world.programs[static_cast<size_t>(rank)].size(); ++m) {
    const RankProgram& mine = world.programs[static_cast<size_t>(rank)][m];
    ReceiveOrders& orders = plan.receive_orders[mine.mode];
    for (const ChannelMessages& messages : channel_messages(mine)) {
      if (messages.received_tags.empty()) continue;
      const RankProgram& sender = world.programs[static_cast<size_t>(messages.peer)][m];
      for (const ChannelMessages& theirs : channel_messages(sender)) {
        if (theirs.peer == rank) orders[messages.peer] = theirs.sent_tags;
      }
    }
  }
  return plan;
}

std::vector<GemmShape> gemm_shapes_of(const World& world, int64_t rank, const PlanStage& stage) {
  const bool layers = stage.down_layers.count > 0 || stage.up_layers.count > 0;
  return job_gemm_shapes(world.job, rank, layers, stage.head_loss);
}

const PlanStage& stage_of(const Plan& plan, int64_t stage_index) {
  for (const PlanStage& s : plan.stages) {
    if (s.stage == stage_index) return s;
  }
  throw Error(ErrorCode::kInternal, fmt::format("no stage {}", stage_index));
}

RankRecord simulate_rank(const World& world, int64_t rank, ExecutionMode mode, int64_t iterations,
                         const std::string& max_connections) {
  RecordingDevice device;
  RankRecord record;
  record.rank = rank;
  const std::vector<RankProgram>& programs = world.programs[static_cast<size_t>(rank)];
  const RankProgram& program = programs[mode == ExecutionMode::kCoExecuted ? 0 : 1];
  const PlanStage& stage = stage_of(world.plan, program.stage);
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
  for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
    if (range.count > 0) layer_ranges.emplace_back(range.first, range.count);
  }
  Model model(world.job, rank, layer_ranges, stage.embedding, stage.head_loss, 7, {&device});
  // The engine's communicators (cuda_engine.cc): TP; with CP the ring's and DP x CP; with EP
  // the all-to-alls' and the expert-data-parallel group.
  DeviceCommSetup setup = model_comm_setup(world.job.parallel);
  setup.num_layers = world.job.model.num_layers;
  {
    DeviceSession session(device, setup, {&programs[0], &programs[1]},
                          gemm_shapes_of(world, rank, stage),
                          model_attention_setup(rank_shape(world.job, rank),
                                                !layer_ranges.empty() && world.job.parallel.cp == 1,
                                                /*deterministic=*/false, AttentionChoice::kAuto),
                          max_connections, [&](DeviceApi& api, const DeviceCommSetup& comm_setup) {
                            return std::make_unique<DeviceCommDirectory>(
                                api, rank, comm_setup, agreed_plan(world, comm_setup, rank));
                          });
    record.own_streams = session.streams().count().own;
    record.library_streams = session.streams().count().library;
    record.communicators = session.comms().size();
    record.attention = session.preparation().attention;
    // As the CUDA engine's connect(): every activation's place before the first iteration.
    model.plan_activation_memory({&programs[0], &programs[1]},
                                 rt::program_orders({&programs[0], &programs[1]}));
    device.mark("activations laid out");
    StageModelOnDevice<RecordingBackend> on_device(model, [&](StreamHandle stream) {
      return RecordingBackend::Exec{&device, stream};
    });
    int64_t micro_batches = 0;
    for (const Instruction& instruction : program.instructions) {
      micro_batches = std::max(micro_batches, instruction.micro_batch + 1);
    }
    // A CP rank holds seq / cp tokens of each sequence (runtime/train/context_split.h).
    const int64_t tokens =
        world.job.parallel.micro_batch_size * world.job.parallel.seq_length / world.job.parallel.cp;
    for (int64_t i = 1; i <= iterations; ++i) {
      model.start_iteration(micro_batches);
      for (int64_t mb = 0; mb < micro_batches; ++mb) {
        model.set_tokens(mb, {.tokens = std::vector<int32_t>(static_cast<size_t>(tokens), 1),
                              .targets = std::vector<int32_t>(static_cast<size_t>(tokens), 2)});
      }
      device.mark(fmt::format("iteration {}", i));
      execute_device_program(device, world.plan, program, on_device, session.comms(),
                             session.streams());
    }
    device.mark("teardown");
  }
  record.calls = device.calls();
  return record;
}

}  // namespace

std::vector<RankRecord> simulate_run(const Plan& plan, const JobSpec& job, ExecutionMode mode,
                                     int64_t iterations, const std::string& max_connections) {
  World world{.plan = plan,
              .job = job,
              .placement = Placement(job.parallel, job.cluster.gpus_per_node),
              .programs = {}};
  const int64_t ranks = world.placement.world_size();
  for (int64_t r = 0; r < ranks; ++r) {
    world.programs.push_back({lower_rank_program(plan, job, r, ExecutionMode::kCoExecuted),
                              lower_rank_program(plan, job, r, ExecutionMode::kSequential)});
  }
  std::vector<RankRecord> records;
  for (int64_t r = 0; r < ranks; ++r) {
    records.push_back(simulate_rank(world, r, mode, iterations, max_connections));
  }
  return records;
}

}  // namespace dhelix::cuda::testing
