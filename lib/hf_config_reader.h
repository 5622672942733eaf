#pragma once
// HuggingFace config.json import. The entry point, model_from_hf_config, is declared in
// model_reader.h beside the other model readers; this header lists what it supports.
//
// Families and what dhelix takes from each (other HF keys are ignored, as configs carry
// many that do not change the training shape):
//   llama (LlamaForCausalLM, MistralForCausalLM): RMSNorm, SwiGLU, RoPE, GQA
//   mixtral (MixtralForCausalLM): llama + num_local_experts / num_experts_per_tok
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
