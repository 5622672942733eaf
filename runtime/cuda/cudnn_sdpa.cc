// cuDNN 9 backend-API implementation of CudnnSdpa (cudnn_sdpa.h). Built only with
// DHELIX_WITH_CUDNN; cudnn_sdpa_absent.cc stands in otherwise.
//
// Every attribute set here is named in cudnn_graph_v9.h (cuDNN 9.19): tensors
// (CUDNN_ATTR_TENSOR_*), the pointwise, matmul, reduction and reshape operations
// (CUDNN_ATTR_OPERATION_{POINTWISE,MATMUL,REDUCTION,RESHAPE}_*), the operation graph, the
// heuristics (CUDNN_ATTR_ENGINEHEUR_*, modes CUDNN_HEUR_MODE_A, then _FALLBACK), the engine's
// numerical notes (CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) and the execution plan and variant pack.

#include "runtime/cuda/cudnn_sdpa.h"

#include <cudnn_graph.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/sdpa_graph.h"

namespace dhelix::cuda {
namespace {

// The cuDNN functions dhelix calls, resolved from libcudnn_graph.so.9 at run time.
struct CudnnLibrary {
  void* handle = nullptr;
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;

  // libcudnn_graph opens its engine and heuristic libraries by soname when a graph is
  // finalized; a directory off the loader's path would leave it without engines. Loading them
  // first, by full path and RTLD_GLOBAL, makes those later soname loads find them.
  static void* open_by_path(const std::string& dir) {
    for (const char* engine :
         {"libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
          "libcudnn_heuristic.so.9"}) {
      dlopen((dir + "/" + engine).c_str(), RTLD_NOW | RTLD_GLOBAL);  // absent: cuDNN says so
    }
    return dlopen((dir + "/libcudnn_graph.so.9").c_str(), RTLD_NOW | RTLD_LOCAL);
  }

  bool open() {
    // The loader's search (LD_LIBRARY_PATH, ld.so.cache), then where cmake found it.
    handle = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_LOCAL);
#ifdef DHELIX_CUDNN_LIBRARY_DIR
    if (handle == nullptr) handle = open_by_path(DHELIX_CUDNN_LIBRARY_DIR);
#endif
    if (handle == nullptr) return false;
    bool all = true;
    auto resolve = [&](auto& function, const char* symbol) {
      function =
          reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, symbol));
      all = all && function != nullptr;
    };
    resolve(get_version, "cudnnGetVersion");
    resolve(error_string, "cudnnGetErrorString");
    resolve(last_error, "cudnnGetLastErrorString");
    resolve(create, "cudnnCreate");
    resolve(destroy, "cudnnDestroy");
    resolve(set_stream, "cudnnSetStream");
    resolve(create_descriptor, "cudnnBackendCreateDescriptor");
    resolve(destroy_descriptor, "cudnnBackendDestroyDescriptor");
    resolve(set_attribute, "cudnnBackendSetAttribute");
    resolve(get_attribute, "cudnnBackendGetAttribute");
    resolve(finalize, "cudnnBackendFinalize");
    resolve(execute, "cudnnBackendExecute");
    return all;
  }
};

// The one check wrapper of every cuDNN call: throws Error(kInternal) naming the call,
// cuDNN's status name and its last error text.
void check_cudnn(const CudnnLibrary& lib, cudnnStatus_t status, const char* call, const char* file,
                 int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::array<char, 512> detail{};
  lib.last_error(detail.data(), detail.size());
  throw Error(ErrorCode::kInternal,
              fmt::format("{} failed: {}{}{} ({}:{})", call, lib.error_string(status),
                          detail[0] != '\0' ? ": " : "", detail.data(), file, line));
}
#define DHELIX_CUDNN(call) check_cudnn(lib_, (call), #call, __FILE__, __LINE__)

cudnnDataType_t data_type(SdpaDtype dtype) {
  switch (dtype) {
    case SdpaDtype::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case SdpaDtype::kFloat32:
      return CUDNN_DATA_FLOAT;
    case SdpaDtype::kInt32:
      return CUDNN_DATA_INT32;
    case SdpaDtype::kBoolean:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t pointwise_mode(SdpaMode mode) {
  switch (mode) {
    case SdpaMode::kMul:
      return CUDNN_POINTWISE_MUL;
    case SdpaMode::kAdd:
      return CUDNN_POINTWISE_ADD;
    case SdpaMode::kSub:
      return CUDNN_POINTWISE_SUB;
    case SdpaMode::kDiv:
      return CUDNN_POINTWISE_DIV;
    case SdpaMode::kExp:
      return CUDNN_POINTWISE_EXP;
    case SdpaMode::kLog:
      return CUDNN_POINTWISE_LOG;
    case SdpaMode::kGenIndex:
      return CUDNN_POINTWISE_GEN_INDEX;
    case SdpaMode::kCmpGe:
      return CUDNN_POINTWISE_CMP_GE;
    case SdpaMode::kBinarySelect:
      return CUDNN_POINTWISE_BINARY_SELECT;
    default:
      return CUDNN_POINTWISE_IDENTITY;
  }
}

constexpr int64_t kAlignment = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

class CudnnSdpaImpl final : public CudnnSdpa {
 public:
  explicit CudnnSdpaImpl(CudnnLibrary lib) : lib_(lib) {
    version_ = static_cast<int64_t>(lib_.get_version());
    if (lib_.create(&handle_) != CUDNN_STATUS_SUCCESS) handle_ = nullptr;  // e.g. no GPU
  }
  ~CudnnSdpaImpl() override {
    plans_.clear();
    if (handle_ != nullptr) lib_.destroy(handle_);
  }

  // Without a handle (no usable GPU) cuDNN is as good as absent.
  int64_t version() const override { return handle_ != nullptr ? version_ : 0; }

  // Every node of `graph` and the operation graph made and finalized; needs no GPU (the
  // operation graph gets the handle only when there is one). The first failure in words.
  std::optional<std::string> check_nodes(const SdpaGraph& graph) {
    try {
      Plan plan;
      operation_graph(plan, graph);
      return std::nullopt;
    } catch (const Error& error) {
      return std::string(error.what());
    }
  }

  std::optional<std::string> prepare(const kernels::AttentionShape& shape,
                                     bool deterministic) override {
    if (handle_ == nullptr) return "cuDNN could not make a handle (cudnnCreate)";
    // Each graph form in turn (sdpa_graph.h); the refusal names every form's reason.
    std::string refusals;
    for (const SdpaGraphForm form : kSdpaGraphForms) {
      try {
        Plan forward = build("forward", sdpa_forward_graph(shape, version_, form), false);
        Plan backward = build("backward", sdpa_backward_graph(shape, version_, deterministic, form),
                              deterministic);
        plans_[key(shape, false)] = std::move(forward);
        plans_[key(shape, true)] = std::move(backward);
        return std::nullopt;
      } catch (const Error& error) {
        refusals += fmt::format("{}{} graph: {}", refusals.empty() ? "" : "; ",
                                sdpa_graph_form_name(form), error.what());
      }
    }
    return refusals;
  }

  bool has_plans(const kernels::AttentionShape& shape) const override {
    return plans_.contains(key(shape, false)) && plans_.contains(key(shape, true));
  }

  int64_t workspace_bytes(const kernels::AttentionShape& shape) const override {
    if (!has_plans(shape)) return 0;
    const Plan& f = plans_.at(key(shape, false));
    const Plan& b = plans_.at(key(shape, true));
    return std::max(aligned(f.workspace), aligned(b.workspace) + aligned(b.dq_accum_bytes));
  }

  void forward(const kernels::AttentionShape& shape, const __nv_bfloat16* q, const __nv_bfloat16* k,
               const __nv_bfloat16* v, __nv_bfloat16* out, float* lse, const Workspace& workspace,
               cudaStream_t stream) override {
    run(plans_.at(key(shape, false)),
        {{kSdpaQ, q}, {kSdpaK, k}, {kSdpaV, v}, {kSdpaO, out}, {kSdpaStats, lse}}, workspace,
        stream);
  }

  void backward(const kernels::AttentionShape& shape, const __nv_bfloat16* q,
                const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* out,
                const float* lse, const __nv_bfloat16* dout, __nv_bfloat16* dq, __nv_bfloat16* dk,
                __nv_bfloat16* dv, float* delta, const Workspace& workspace,
                cudaStream_t stream) override {
    const Plan& plan = plans_.at(key(shape, true));
    std::map<int64_t, const void*> pointers{
        {kSdpaQ, q},     {kSdpaK, k},   {kSdpaV, v},   {kSdpaO, out}, {kSdpaStats, lse},
        {kSdpaDO, dout}, {kSdpaDQ, dq}, {kSdpaDK, dk}, {kSdpaDV, dv}, {kSdpaSoftmaxSum, delta}};
    if (plan.dq_accum_bytes > 0) {
      // The accumulator follows the plan's own workspace; zeroed as cuDNN before 9.6 needs
      // (the frontend's note) and harmless after.
      char* accum = static_cast<char*>(workspace.data) + aligned(plan.workspace);
      DHELIX_CUDA(cudaMemsetAsync(accum, 0, static_cast<size_t>(plan.dq_accum_bytes), stream));
      pointers[kSdpaDQAccum] = accum;
    }
    run(plan, pointers, workspace, stream);
  }

 private:
  // A descriptor destroyed with its owner.
  struct Descriptor {
    const CudnnLibrary* lib = nullptr;
    cudnnBackendDescriptor_t raw = nullptr;
    Descriptor() = default;
    Descriptor(const Descriptor&) = delete;
    Descriptor& operator=(const Descriptor&) = delete;
    Descriptor(Descriptor&& o) noexcept : lib(o.lib), raw(o.raw) { o.raw = nullptr; }
    ~Descriptor() {
      if (raw != nullptr) lib->destroy_descriptor(raw);
    }
  };
  // A finalized plan and every descriptor it was made from.
  struct Plan {
    std::vector<std::unique_ptr<Descriptor>> keep;
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace = 0;
    int64_t dq_accum_bytes = 0;
    std::vector<int64_t> uids;
    // Scalars passed by value (scale, mask value, 1): the variant pack points at these host
    // values, as cudnn-frontend passes its pass-by-value tensors; a map keeps them in place.
    std::map<int64_t, float> scalars;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  static Key key(const kernels::AttentionShape& s, bool backward) {
    return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, backward};
  }

  cudnnBackendDescriptor_t make(Plan& plan, cudnnBackendDescriptorType_t type) {
    auto d = std::make_unique<Descriptor>();
    d->lib = &lib_;
    DHELIX_CUDNN(lib_.create_descriptor(type, &d->raw));
    plan.keep.push_back(std::move(d));
    return plan.keep.back()->raw;
  }
  template <class T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, const T* values, int64_t count = 1) {
    DHELIX_CUDNN(lib_.set_attribute(d, name, type, count, values));
  }
  void set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                      cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }

  cudnnBackendDescriptor_t tensor(Plan& plan, const SdpaTensor& t) {
    cudnnBackendDescriptor_t d = make(plan, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const cudnnDataType_t dtype = data_type(t.dtype);
    const int64_t alignment = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dtype);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, t.dims.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, t.strides.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &t.uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    const bool is_virtual = t.is_virtual;
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (t.by_value) {
      const bool by_value = true;
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    }
    if (t.reorder_f16x16) {
      const cudnnBackendTensorReordering_t reordering = CUDNN_TENSOR_REORDERING_F16x16;
      set(d, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, &reordering);
    }
    DHELIX_CUDNN(lib_.finalize(d));
    return d;
  }

  cudnnBackendDescriptor_t operation(Plan& plan, const SdpaOp& op,
                                     const std::map<int64_t, cudnnBackendDescriptor_t>& t) {
    const cudnnDataType_t compute = data_type(op.compute);
    switch (op.kind) {
      case SdpaOpKind::kMatmul: {
        cudnnBackendDescriptor_t desc = make(plan, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
        DHELIX_CUDNN(lib_.finalize(desc));
        cudnnBackendDescriptor_t o = make(plan, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        set_descriptor(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, t.at(op.x));
        set_descriptor(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, t.at(op.b));
        set_descriptor(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, t.at(op.y));
        set_descriptor(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc);
        DHELIX_CUDNN(lib_.finalize(o));
        return o;
      }
      case SdpaOpKind::kReduction: {
        cudnnBackendDescriptor_t desc = make(plan, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        const cudnnReduceTensorOp_t reduce =
            op.mode == SdpaMode::kReduceMax ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
        set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduce);
        set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
        DHELIX_CUDNN(lib_.finalize(desc));
        cudnnBackendDescriptor_t o = make(plan, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        set_descriptor(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, t.at(op.x));
        set_descriptor(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, t.at(op.y));
        set_descriptor(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc);
        DHELIX_CUDNN(lib_.finalize(o));
        return o;
      }
      case SdpaOpKind::kReshape: {
        cudnnBackendDescriptor_t o = make(plan, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        set_descriptor(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, t.at(op.x));
        set_descriptor(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, t.at(op.y));
        DHELIX_CUDNN(lib_.finalize(o));
        return o;
      }
      case SdpaOpKind::kPointwise:
        break;
    }
    cudnnBackendDescriptor_t desc = make(plan, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnPointwiseMode_t mode = pointwise_mode(op.mode);
    set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &compute);
    if (op.axis >= 0) set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &op.axis);
    DHELIX_CUDNN(lib_.finalize(desc));
    cudnnBackendDescriptor_t o = make(plan, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_descriptor(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc);
    set_descriptor(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, t.at(op.x));
    if (op.b != 0) set_descriptor(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, t.at(op.b));
    if (op.t != 0) set_descriptor(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t.at(op.t));
    set_descriptor(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, t.at(op.y));
    DHELIX_CUDNN(lib_.finalize(o));
    return o;
  }

  // Whether an engine config's engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC.
  bool nondeterministic(Plan& plan, cudnnBackendDescriptor_t config) {
    cudnnBackendDescriptor_t engine = make(plan, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t count = 0;
    DHELIX_CUDNN(lib_.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine));
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    DHELIX_CUDNN(lib_.get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                    CUDNN_TYPE_NUMERICAL_NOTE, notes.size(), &count, notes.data()));
    for (int64_t i = 0; i < count && i < static_cast<int64_t>(notes.size()); ++i) {
      if (notes[static_cast<size_t>(i)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
    }
    return false;
  }

  // Descriptors of the graph, the heuristics' engine configs in order, the first whose plan
  // finalizes (skipping non-deterministic engines when asked). Throws Error with cuDNN's
  // words when none does.
  // The graph's tensors and nodes, and the finalized operation graph.
  cudnnBackendDescriptor_t operation_graph(Plan& plan, const SdpaGraph& graph) {
    std::map<int64_t, cudnnBackendDescriptor_t> tensors;
    for (const SdpaTensor& t : graph.tensors) tensors[t.uid] = tensor(plan, t);
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const SdpaOp& op : graph.ops) {
      try {
        ops.push_back(operation(plan, op, tensors));
      } catch (const Error& error) {
        throw Error(error.code(), fmt::format("node {}: {}", op.name, error.what()));
      }
    }
    cudnnBackendDescriptor_t op_graph = make(plan, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (handle_ != nullptr) {
      set(op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    }
    set(op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
        static_cast<int64_t>(ops.size()));
    DHELIX_CUDNN(lib_.finalize(op_graph));
    return op_graph;
  }

  // The engine configurations cuDNN's heuristics of `mode` offer for `op_graph`, best first.
  std::vector<cudnnBackendDescriptor_t> engine_configs(Plan& plan,
                                                       cudnnBackendDescriptor_t op_graph,
                                                       cudnnBackendHeurMode_t mode) {
    cudnnBackendDescriptor_t heuristics = make(plan, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph);
    set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    DHELIX_CUDNN(lib_.finalize(heuristics));
    int64_t available = 0;
    DHELIX_CUDNN(lib_.get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr));
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < available; ++i) {
      configs.push_back(make(plan, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    }
    int64_t returned = 0;
    if (available > 0) {
      DHELIX_CUDNN(lib_.get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned,
                                      configs.data()));
    }
    configs.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, available)));
    return configs;
  }

  // The operation graph, then the engine configurations of heuristics mode A and, should none
  // of them finalize, of CUDNN_HEUR_MODE_FALLBACK: the first whose execution plan finalizes
  // (skipping non-deterministic engines when asked). Throws Error with cuDNN's words when
  // none does.
  Plan build(const char* what, const SdpaGraph& graph, bool deterministic) {
    Plan plan;
    cudnnBackendDescriptor_t op_graph = operation_graph(plan, graph);
    int64_t offered = 0;
    std::string last_refusal = "the heuristics offered no engine";
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      std::vector<cudnnBackendDescriptor_t> configs;
      try {
        configs = engine_configs(plan, op_graph, mode);
      } catch (const Error& error) {
        last_refusal = error.what();
        continue;
      }
      offered += static_cast<int64_t>(configs.size());
      for (cudnnBackendDescriptor_t config : configs) {
        if (deterministic && nondeterministic(plan, config)) {
          last_refusal = "an engine offered is marked CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC";
          continue;
        }
        cudnnBackendDescriptor_t candidate = make(plan, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
        set_descriptor(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
        const cudnnStatus_t status = lib_.finalize(candidate);
        if (status != CUDNN_STATUS_SUCCESS) {
          std::array<char, 512> detail{};
          lib_.last_error(detail.data(), detail.size());
          last_refusal =
              fmt::format("cudnnBackendFinalize(execution plan) returned {}{}{}",
                          lib_.error_string(status), detail[0] != '\0' ? ": " : "", detail.data());
          continue;
        }
        int64_t count = 0;
        DHELIX_CUDNN(lib_.get_attribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                        CUDNN_TYPE_INT64, 1, &count, &plan.workspace));
        plan.plan = candidate;
        plan.dq_accum_bytes = graph.dq_accum_bytes;
        plan.uids = graph.bound_uids;
        for (const SdpaTensor& t : graph.tensors) {
          if (t.by_value) plan.scalars[t.uid] = t.value;
        }
        return plan;
      }
    }
    throw Error(ErrorCode::kUnsupported,
                fmt::format("no cuDNN engine runs the {} graph ({} offered): {}", what, offered,
                            last_refusal));
  }

  void run(const Plan& plan, const std::map<int64_t, const void*>& pointers,
           const Workspace& workspace, cudaStream_t stream) {
    const int64_t needed = aligned(plan.workspace) + aligned(plan.dq_accum_bytes);
    if (workspace.bytes < needed) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("cuDNN attention needs {} bytes of workspace; the stream has {}",
                              needed, workspace.bytes));
    }
    std::vector<int64_t> uids = plan.uids;
    std::vector<void*> data;
    for (int64_t uid : plan.uids) data.push_back(const_cast<void*>(pointers.at(uid)));
    for (const auto& [uid, value] : plan.scalars) {
      uids.push_back(uid);
      data.push_back(const_cast<float*>(&value));
    }
    Plan pack_owner;
    cudnnBackendDescriptor_t pack = make(pack_owner, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(),
        static_cast<int64_t>(uids.size()));
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(),
        static_cast<int64_t>(data.size()));
    void* scratch = workspace.data;
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &scratch);
    DHELIX_CUDNN(lib_.finalize(pack));
    DHELIX_CUDNN(lib_.set_stream(handle_, stream));
    DHELIX_CUDNN(lib_.execute(handle_, plan.plan, pack));
  }

  CudnnLibrary lib_;
  cudnnHandle_t handle_ = nullptr;
  int64_t version_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace

bool CudnnSdpa::built_with_cudnn() { return true; }

std::optional<std::string> check_graph_descriptors(const SdpaGraph& graph, bool* loaded) {
  CudnnLibrary lib;
  *loaded = lib.open();
  if (!*loaded) return "libcudnn_graph.so.9 could not be loaded";
  CudnnSdpaImpl impl(lib);
  return impl.check_nodes(graph);
}

std::unique_ptr<CudnnSdpa> CudnnSdpa::load() {
  CudnnLibrary lib;
  if (!lib.open()) {
    const char* why = dlerror();
    return missing_cudnn(fmt::format("libcudnn_graph.so.9 could not be loaded{}{}",
                                     why != nullptr ? ": " : "", why != nullptr ? why : ""));
  }
  return std::make_unique<CudnnSdpaImpl>(lib);
}

}  // namespace dhelix::cuda
