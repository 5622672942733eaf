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
#include "runtime/cuda/device_gradient_reducer.h"
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
  const std::string group = !slot.cp_level ? parallel_dim_name(slot.dim)
                            : *slot.cp_level == Placement::CpLevel::kA2a ? "cp a2a"
                                                                         : "cp ring";
  return fmt::format("{} ({})", group, device_stream_name(slot.stream));
}

// What DeviceCommDirectory::over_mpi would agree on, from every rank's programs.
DeviceCommPlan agreed_plan(const World& world, const DeviceCommSetup& setup, int64_t rank) {
  DeviceCommPlan plan;
  const auto no_op = [](CommId&) {};
  for (const CollectiveSlot& slot : setup.collectives) {
    const ProcessGroup group =
        slot.cp_level
            ? world.placement.cp_sub_group(rank, world.job.parallel.cp_a2a_group(), *slot.cp_level)
            : world.placement.group(slot.dim, rank);
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
  const std::vector<PlanLayerRange> ranges = stage.layer_ranges();
  const bool layers = std::any_of(ranges.begin(), ranges.end(),
                                  [](const PlanLayerRange& range) { return range.count > 0; });
  return job_gemm_shapes(world.job, rank, layers, stage.head_loss);
}

const PlanStage& stage_of(const Plan& plan, int64_t stage_index) {
  for (const PlanStage& s : plan.stages) {
    if (s.stage == stage_index) return s;
  }
  throw Error(ErrorCode::kInternal, fmt::format("no stage {}", stage_index));
}

// The CUDA engine's reducer (cuda_engine.cc's connect()) over the recording device: its
// buffers are logged allocations of host memory, its kernels recorded launches.
std::unique_ptr<DeviceGradientReducer> make_reducer(const World& world, RecordingDevice& device,
                                                    Model& model, DeviceSession& session,
                                                    const RankProgram& first,
                                                    const SimulatedReduction& options,
                                                    std::vector<std::vector<float>>& memory) {
  const ParallelSpec& parallel = world.job.parallel;
  std::vector<DeviceParameter> params;
  std::vector<rt::BucketedParameter> shapes;
  for (const auto& p : model.parameters()) {
    if (p.fsdp_shard) continue;  // summed by the plan's reduce-scatters
    params.push_back({p.name, p.values, p.gradient, p.count, p.sum_gradient_over_tp, p.expert});
    shapes.push_back({p.name, p.count, p.expert});
  }
  DeviceCommDirectory& comms = session.comms();
  DeviceReductionGroups groups;
  if (parallel.tp > 1) groups.tp = &comms.group(ParallelDim::kTp, DeviceStream::kCompute);
  if (parallel.cp > 1 || (parallel.dp > 1 && parallel.fsdp_shards_parameters())) {
    groups.dense = &comms.gradient_group();
  } else if (parallel.dp > 1) {
    groups.dense = &comms.group(ParallelDim::kDp, DeviceStream::kCompute);
  }
  if (parallel.ep > 1) groups.expert = &comms.expert_gradient_group();
  const DeviceFloats allocate = [&](int64_t count) {
    device.note_allocation(count * static_cast<int64_t>(sizeof(float)));
    memory.emplace_back(static_cast<size_t>(std::max<int64_t>(count, 1)), 0.0f);
    return memory.back().data();
  };
  DeviceOptimizerKernels kernels{
      .adamw = [&device](const kernels::AdamWStep&, size_t, int64_t, int64_t, const float*, float*,
                         float*, StreamHandle stream) { device.kernel("adamw", stream); },
      .refresh = [&device](size_t, StreamHandle stream) { device.kernel("refresh", stream); }};
  return std::make_unique<DeviceGradientReducer>(
      device, std::move(params),
      rt::reduction_buckets_of(shapes, &first, options.bucket_elements, parallel.ep > 1), groups,
      session.streams().stream(DeviceStream::kCompute), session.streams().reduction_stream(),
      options.sharded, allocate, std::move(kernels));
}

RankRecord simulate_rank(const World& world, int64_t rank, ExecutionMode mode, int64_t iterations,
                         const std::string& max_connections,
                         const std::optional<SimulatedReduction>& reduction,
                         const BeforeExecute& before_execute) {
  RecordingDevice device;
  RankRecord record;
  record.rank = rank;
  const std::vector<RankProgram>& programs = world.programs[static_cast<size_t>(rank)];
  const RankProgram& program = programs[mode == ExecutionMode::kCoExecuted ? 0 : 1];
  const PlanStage& stage = stage_of(world.plan, program.stage);
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
  for (const PlanLayerRange& range : stage.layer_ranges()) {  // the W's, the V's or model chunks
    if (range.count > 0) layer_ranges.emplace_back(range.first, range.count);
  }
  const ParallelSpec& parallel = world.job.parallel;
  Model model(world.job, rank, layer_ranges, stage.embedding, stage.head_loss, 7, {&device},
              {.enabled = parallel.fsdp_shards_parameters(),
               .reshard_after_forward = parallel.fsdp_reshard_after_forward});
  // The engine's communicators (cuda_engine.cc): TP; with CP the ring's and DP x CP; with EP
  // the all-to-alls' and the expert-data-parallel group.
  DeviceCommSetup setup = model_comm_setup(world.job.parallel);
  setup.num_layers = world.job.model.num_layers;
  // As the engine: the gradient groups warmed at the reducer's largest buckets.
  setup.warmup = comm_warmup_sizes(world.job, rank);
  if (reduction) {
    std::vector<rt::BucketedParameter> shapes;
    for (const auto& p : model.parameters()) {
      if (!p.fsdp_shard) shapes.push_back({p.name, p.count, p.expert});
    }
    size_gradient_warmups(setup.warmup,
                          rt::reduction_buckets_of(shapes, &programs[0], reduction->bucket_elements,
                                                   world.job.parallel.ep > 1));
  }
  // FSDP: the DP communicators warmed up to the largest gathered layer, as the engine.
  for (const auto& p : model.parameters()) {
    if (p.fsdp_shard) setup.warmup.dp = std::max(setup.warmup.dp, p.count * parallel.dp);
  }
  {
    DeviceSession session(device, setup, {&programs[0], &programs[1]},
                          gemm_shapes_of(world, rank, stage),
                          model_attention_setup(rank_shape(world.job, rank), !layer_ranges.empty(),
                                                world.job.parallel.cp_comm_type,
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
    std::vector<std::vector<float>> reducer_memory;  // outlives the reducer
    std::unique_ptr<DeviceGradientReducer> reducer;
    if (reduction) {
      reducer =
          make_reducer(world, device, model, session, programs[0], *reduction, reducer_memory);
      record.buckets = reducer->buckets();
      std::vector<std::string> names;
      for (const auto& p : model.parameters()) {
        if (p.fsdp_shard) continue;  // as make_reducer
        names.push_back(p.name);
        record.parameter_elements += p.count;
      }
      record.last_writers = rt::bucket_last_writers(record.buckets, names, program);
    }
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
      DeviceExecutionOptions options;
      if (reducer) {
        DeviceGradientReducer::Hooks hooks = reducer->start(program, reduction->overlap);
        options.before_instruction = std::move(hooks.before_instruction);
        options.after_instruction = std::move(hooks.after_instruction);
        if (reduction->mark_instructions) {
          options.after_instruction = [&device, after = std::move(options.after_instruction)](
                                          size_t index, StreamHandle stream) {
            device.mark(fmt::format("done {}", index));
            if (after) after(index, stream);
          };
        }
        options.synchronize_after_binding = !reduction->overlap_gather;
      }
      if (before_execute) {
        before_execute(rank, device, session.streams(), session.comms(), options);
      }
      execute_device_program(device, world.plan, program, on_device, session.comms(),
                             session.streams(), std::move(options));
      // As the engine: FSDP's reduced shards summed on the compute stream (none without).
      model.finish_iteration({&device, session.streams().stream(DeviceStream::kCompute)});
      if (!reducer) continue;
      device.mark(fmt::format("update {}", i));
      reducer->finish();
      const StreamHandle compute = session.streams().stream(DeviceStream::kCompute);
      if (reduction->sharded) {
        reducer->step(kernels::make_adamw_step(i, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f),
                      reduction->overlap_gather);
      } else {
        for (size_t p = 0; p < model.parameters().size(); ++p) device.kernel("adamw", compute);
      }
    }
    device.mark("teardown");
  }
  record.calls = device.calls();
  return record;
}

}  // namespace

std::vector<RankRecord> simulate_run(const Plan& plan, const JobSpec& job, ExecutionMode mode,
                                     int64_t iterations, const std::string& max_connections,
                                     std::optional<SimulatedReduction> reduction,
                                     BeforeExecute before_execute) {
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
    records.push_back(
        simulate_rank(world, r, mode, iterations, max_connections, reduction, before_execute));
  }
  return records;
}

}  // namespace dhelix::cuda::testing
