#pragma once
// The element types of the buffers the model hands to communication.

namespace dhelix::rt {

/// Activations are the backend's Act (fp32 on the CPU, bf16 on CUDA); the loss statistics
/// are fp32 on every backend.
enum class ElementType { kFloat32, kBFloat16 };
const char* element_type_name(ElementType type);  ///< "float32", "bfloat16"

}  // namespace dhelix::rt
