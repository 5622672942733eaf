#pragma once
// HuggingFace config.json import. The entry point, model_from_hf_config, is declared in
// model_reader.h beside the other model readers; this header lists what it supports.
//
// Families and what dhelix takes from each (other HF keys are ignored, as configs carry
// many that do not change the training shape):
//   llama (LlamaForCausalLM): RMSNorm, SwiGLU, RoPE, GQA
//   mistral (MistralForCausalLM): llama + sliding_window (attention cost, lib/model_spec.h)
//   mixtral (MixtralForCausalLM): mistral + num_local_experts / num_experts_per_tok
//   qwen2 (Qwen2ForCausalLM): llama with biases on Q, K and V only; sliding window when
//     use_sliding_window windows every layer
//   qwen2_moe (Qwen2MoeForCausalLM): qwen2 attention, num_experts routed experts of
//     moe_intermediate_size and a gated shared expert of shared_expert_intermediate_size
// max_position_embeddings is optional for these RoPE families (the job sets the sequence).
//   phimoe (PhiMoEForCausalLM): LayerNorm, SwiGLU experts, RoPE, attention biases
//   gpt2 (GPT2LMHeadModel): LayerNorm, GELU, learned positions, biases, tied embeddings
//   gpt_neox (GPTNeoXForCausalLM): LayerNorm, GELU, RoPE (partial rotary), biases

#include <string>
#include <vector>

#include "lib/model_reader.h"

namespace dhelix {

/// HF "architectures" names dhelix imports, in a stable order (for messages and docs).
std::vector<std::string> supported_hf_architectures();

}  // namespace dhelix
