#pragma once
// AdamW (Loshchilov & Hutter 2019), one parameter element, step t >= 1, in the order
// PyTorch's torch.optim.AdamW applies it (decay first, then the Adam step):
//   p  = p * (1 - lr * weight_decay)            (decoupled weight decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p  = p - lr * (m / c1) / (sqrt(v / c2) + eps),   c1 = 1 - beta1^t, c2 = 1 - beta2^t
// c1 and c2 (bias corrections) are computed once per step in double on the host and
// passed in AdamWStep, so every element and every backend uses the same rounded values.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Hyper-parameters of one optimizer step, bias corrections included.
struct AdamWStep {
  float lr = 0.0f;                ///< learning rate of this step
  float beta1 = 0.9f;             ///< first-moment decay
  float beta2 = 0.95f;            ///< second-moment decay
  float eps = 1e-8f;              ///< added to sqrt(v_hat)
  float weight_decay = 0.0f;      ///< decoupled decay rate (multiplied by lr)
  float bias_correction1 = 1.0f;  ///< 1 - beta1^t
  float bias_correction2 = 1.0f;  ///< 1 - beta2^t
};

/// AdamWStep for step t (1-based) with the bias corrections filled in (host only).
inline AdamWStep make_adamw_step(int64_t t, float lr, float beta1, float beta2, float eps,
                                 float weight_decay) {
  AdamWStep step;
  step.lr = lr;
  step.beta1 = beta1;
  step.beta2 = beta2;
  step.eps = eps;
  step.weight_decay = weight_decay;
  step.bias_correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  step.bias_correction2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  return step;
}

/// Updates one element: parameter p, first moment m and second moment v from gradient g.
DHELIX_HOST_DEVICE inline void adamw_update(const AdamWStep& step, float g, float* p, float* m,
                                            float* v) {
  float param = *p * (1.0f - step.lr * step.weight_decay);
  float first = step.beta1 * *m + (1.0f - step.beta1) * g;
  float second = step.beta2 * *v + (1.0f - step.beta2) * (g * g);
  float m_hat = first / step.bias_correction1;
  float v_hat = second / step.bias_correction2;
  *p = param - step.lr * (m_hat / (sqrtf(v_hat) + step.eps));
  *m = first;
  *v = second;
}

}  // namespace dhelix::kernels
