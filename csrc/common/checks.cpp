// The one check of checks.h that needs the CUDA runtime's headers, compiled once (by the host
// compiler) for both backends.
#include "common/checks.h"

#ifdef PNN_FAST_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pnn_fast {

bool host_read_back_allowed(const at::Tensor& t) {
#ifdef PNN_FAST_WITH_CUDA
  if (t.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(t.device().index()), &status));
    return status == cudaStreamCaptureStatusNone;
  }
#endif
  return true;
}

}  // namespace pnn_fast
