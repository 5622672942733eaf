#include "lib/cluster_presets.h"

#include <fmt/format.h>

#include "lib/cluster_reader.h"
#include "lib/did_you_mean.h"
#include "lib/error.h"
#include "lib/text.h"

// Figures come from the project's hardware-figures reference (vendor datasheets, NCCL's
// tuning model, published nccl-tests runs) and the DHelix paper's section 6.1. Latencies
// are the per-hop alpha of the ring model, fitted to where measured bus bandwidth reaches
// half its peak (about 16-18 MB for an 8-GPU all-reduce on A100 and H100): that is the
// size range of one layer's TP traffic, which is what the planner needs right. The price is
// small-message latency: the ring model then overstates it (126 us instead of the ~34 us
// measured on DGX-A100 for tiny messages); docs/cost-model.md lists this limit.

namespace dhelix {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

constexpr const char* kNcclPcieSms =
    "NCCL uses 2-4 channels (one SM each) on PCIe systems (hardware-figures.md, "
    "Interference): 4 intra-node, 2 for the single NIC";

LinkSpec pcie4_link() {
  return {LinkKind::kPcie, 32.0, 24.0, 10.0,
          "PCIe 4.0 x16: 32 GB/s per direction (paper 6.1, PCI-SIG); ~24 GB/s usable as NCCL's "
          "model assumes (hardware-figures.md, Links); alpha 10 us: the A100 NVLink fit (9 us) "
          "plus NCCL's extra PCIe hop latency (tuning.cc: ~1 us per hop more than NVLink). " +
              std::string(kNcclPcieSms)};
}

LinkSpec nvlink_a800_link() {
  return {LinkKind::kNvLink, 200.0, 160.0, 9.0,
          "A800 NVLink 400 GB/s bidirectional = 200 GB/s per direction (paper 6.1, NVIDIA A800 "
          "datasheet); 8x A800 all-reduce busbw ~160 GB/s (hardware-figures.md, nccl-tests); "
          "alpha 9 us, fitted on A100 (same NVLink generation and NCCL): its 8-GPU all-reduce "
          "busbw reaches half its 228 GB/s peak near 17 MB (1 MB 36, 16 MB 109, 128 MB 174 "
          "GB/s; hardware-figures.md) and n*alpha*B = 17 MB gives 9 us; with A800's 160 GB/s "
          "the model's half point falls at 11.5 MB. NCCL SMs: 16 intra-node "
          "(NVLink systems use 16-32 channels), 8 inter-node (2 channels per NIC, 4 NICs)"};
}

LinkSpec nvlink4_link() {
  return {LinkKind::kNvLink, 450.0, 355.0, 5.5,
          "NVLink4 900 GB/s bidirectional = 450 GB/s per direction (paper 6.1, NVIDIA H100/H200 "
          "datasheets); busbw 355 GB/s: 8x H100 nccl-tests all-gather ~350 and reduce-scatter "
          "~360 GB/s measured (hardware-figures.md), the collectives TP with SP and the "
          "distributed optimizer run (NCCL's ring model assumes ~370; NVLS all-reduce reaches "
          "~479); alpha 5.5 us: 8x H100 all-reduce busbw is half its ~466 GB/s peak near 16 MB "
          "(1 MB 44, 16 MB 234 GB/s), n*alpha*B = 16 MB with B = 355-370 gives 5.4-5.6 us. "
          "NCCL SMs: 24 intra-node (NVLink systems use 16-32 channels), 16 inter-node "
          "(2 channels per NIC, 8 NICs)"};
}

LinkSpec infiniband_link(double gbit_per_s, double bus_gbps, const std::string& measured) {
  return {LinkKind::kInfiniBand, gbit_per_s / 8.0, bus_gbps, 5.0,
          fmt::format("{:.0f} Gb/s InfiniBand NIC = {:.1f} GB/s (paper 6.1); {}; alpha 5 us: "
                      "NCCL's network hop latency (2.7-4.0 us LL/LL128) plus its base latency",
                      gbit_per_s, gbit_per_s / 8.0, measured)};
}

ClusterSpec a40_preset() {
  ClusterSpec cluster;
  cluster.name = "a40";
  cluster.gpu = {"A40",
                 149.7,
                 48 * kGiB,
                 696.0,
                 84,
                 0.75,
                 0.5,
                 0.85,
                 "NVIDIA A40 datasheet: 149.7 dense bf16 TFLOP/s, 48 GB GDDR6, 696 GB/s, 84 SMs "
                 "(hardware-figures.md). No public GEMM figure: 0.75, the middle of the 70-80 % "
                 "assumed there; attention 0.5, below A100's FA2 ~57 % for a GDDR part; "
                 "memory-bound kernels 0.85 (80-88 % seen)"};
  cluster.gpus_per_node = 8;
  cluster.intra_node = pcie4_link();
  cluster.inter_node = infiniband_link(
      100.0, 12.0, "EDR achieves ~96 % of line rate as HDR does (24 of 25 GB/s measured)");
  cluster.nics_per_node = 1;
  cluster.nccl_sms_intra_node = 4;
  cluster.nccl_sms_inter_node = 2;
  cluster.nccl_memory_traffic_factor = 2.5;
  return cluster;
}

ClusterSpec a800_preset() {
  ClusterSpec cluster;
  cluster.name = "a800";
  cluster.gpu = {"A800-SXM",
                 312.0,
                 80 * kGiB,
                 2039.0,
                 108,
                 0.84,
                 0.57,
                 0.85,
                 "NVIDIA A800/A100 SXM 80GB datasheet: 312 dense bf16 TFLOP/s, 80 GB HBM2e, "
                 "2039 GB/s, 108 SMs (hardware-figures.md). GEMM 0.84: 82-86 % at 8192^3 and "
                 "larger, cuBLAS bf16 maximum 267.9 TFLOP/s = 85.9 % on A100 SXM (ml-engineering "
                 "MAMF table, CUDA 12.1); attention 0.57: FA2 fwd+bwd on A100; memory-bound 0.85 "
                 "(80-88 %)"};
  cluster.gpus_per_node = 8;
  cluster.intra_node = nvlink_a800_link();
  cluster.inter_node = infiniband_link(200.0, 24.0, "HDR measured ~24 GB/s (hardware-figures.md)");
  cluster.nics_per_node = 4;
  cluster.nccl_sms_intra_node = 16;
  cluster.nccl_sms_inter_node = 8;
  cluster.nccl_memory_traffic_factor = 2.5;
  return cluster;
}

ClusterSpec h100_preset() {
  ClusterSpec cluster;
  cluster.name = "h100";
  cluster.gpu = {"H100-SXM",
                 989.0,
                 80 * kGiB,
                 3350.0,
                 132,
                 0.8,
                 0.32,
                 0.85,
                 "NVIDIA H100 SXM datasheet: 989 dense bf16 TFLOP/s, 80 GB HBM3, 3350 GB/s, 132 "
                 "SMs (hardware-figures.md). GEMM 0.8: cuBLAS bf16 maximum 792.1 TFLOP/s = 80.1 % "
                 "(ml-engineering MAMF table, CUDA 12.1, best of a shape search); attention 0.32: "
                 "FlashAttention-2 on H100 SXM5, head dim 128, 2k-8k tokens, forward causal "
                 "298-333 and backward 291-318 TFLOP/s (FlashAttention-3 paper, Shah et al. 2024, "
                 "Figs. 5-6), the paper's CUDA 12.2 stack runs FA2 (docs/presets.md); "
                 "memory-bound 0.85 (80-88 %)"};
  cluster.gpus_per_node = 8;
  cluster.intra_node = nvlink4_link();
  cluster.inter_node =
      infiniband_link(400.0, 48.0, "NDR measured ~48-49 GB/s (hardware-figures.md)");
  cluster.nics_per_node = 8;
  cluster.nccl_sms_intra_node = 24;
  cluster.nccl_sms_inter_node = 16;
  cluster.nccl_memory_traffic_factor = 2.5;
  return cluster;
}

ClusterSpec h200_preset() {
  ClusterSpec cluster = h100_preset();
  cluster.name = "h200";
  cluster.gpu = {"H200-SXM",
                 989.0,
                 141 * kGiB,
                 4800.0,
                 132,
                 0.8,
                 0.32,
                 0.85,
                 "NVIDIA H200 SXM datasheet: 989 dense bf16 TFLOP/s, 141 GB HBM3e, 4800 GB/s, 132 "
                 "SMs (hardware-figures.md); efficiencies as H100 (same SM design)"};
  return cluster;
}

}  // namespace

std::optional<ClusterSpec> find_cluster_preset(const std::string& name) {
  if (name == "a40") return a40_preset();
  if (name == "a800") return a800_preset();
  if (name == "h100") return h100_preset();
  if (name == "h200") return h200_preset();
  return std::nullopt;
}

std::vector<std::string> cluster_preset_names() { return {"a40", "a800", "h100", "h200"}; }

ClusterSpec cluster_preset(const std::string& name) {
  if (std::optional<ClusterSpec> preset = find_cluster_preset(name)) return *preset;
  const std::vector<std::string> names = cluster_preset_names();
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("unknown cluster preset \"{}\"{}; presets: {}", name,
                          did_you_mean(name, names), join(names, ", ")));
}

}  // namespace dhelix
