// The checks of checks.h that keep state or need the CUDA runtime's headers, compiled once (by the
// host compiler) for both backends: the capture test, the read-back counter and the deferred
// input errors' flags.
#include "common/checks.h"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ops/clamp.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

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

namespace {

std::atomic<int64_t> host_reads{0};

// The errors' texts ("<op>: <what>"), code = position + 1 (0: no error), and each device's flag:
// int64 [2], (the first error's code, its bound).  Held by leaked pointers: a CUDA tensor destroyed
// at exit, after the CUDA context, would crash the process on its way out.
std::mutex registry_mutex;
std::vector<std::string>& error_texts() {
  static auto* texts = new std::vector<std::string>();
  return *texts;
}
std::unordered_map<std::string, at::Tensor>& device_flags() {
  static auto* flags = new std::unordered_map<std::string, at::Tensor>();
  return *flags;
}

int64_t error_code(const char* op, const char* what) {
  const std::string text = std::string(op) + ": " + what;
  const std::lock_guard<std::mutex> lock(registry_mutex);
  std::vector<std::string>& texts = error_texts();
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i] == text) return static_cast<int64_t>(i) + 1;
  }
  texts.push_back(text);
  return static_cast<int64_t>(texts.size());
}

// The flag of `device`, made on its first use (an op's first, eager call: never inside a CUDA
// graph's capture, which runs after a warm-up call).
at::Tensor device_flag(const at::Device& device) {
  const std::lock_guard<std::mutex> lock(registry_mutex);
  at::Tensor& flag = device_flags()[device.str()];
  if (!flag.defined()) flag = at::zeros({2}, at::TensorOptions().dtype(at::kLong).device(device));
  return flag;
}

}  // namespace

void count_host_read() { ++host_reads; }

void record_input_error(const char* op, const char* what, const at::Tensor& bad, int64_t bound) {
  const int64_t code = error_code(op, what);
  at::Tensor flag = device_flag(bad.device());
  if (!bad.is_cuda()) {  // CPU memory: read it directly, no synchronisation
    int64_t* entry = flag.data_ptr<int64_t>();
    if (bad.item<bool>() && entry[0] == 0) {
      entry[0] = code;
      entry[1] = bound;
    }
    return;
  }
  // flag = flag[0] != 0 ? flag : bad * (code, bound), on the device
  const at::Tensor error = at::stack({bad.to(at::kLong) * code, bad.to(at::kLong) * bound});
  flag.copy_(at::where(flag.narrow(0, 0, 1).ne(0), flag, error));
}

at::Tensor ids_in_range(const char* op, const at::Tensor& ids, int64_t bound, const char* name, const char* noun) {
  const at::Tensor in = ids.contiguous();
  if (in.numel() == 0) return in;
  TORCH_CHECK_VALUE(bound > 0, op, ": ", name, " holds ", in.numel(), " ids but the range [0, 0) is empty");
  const auto [low, high] = at::aminmax(in);
  const at::Tensor bad = low.lt(0).logical_or_(high.ge(bound));
  const std::string what = std::string(name) + " has " + noun + " outside";
  if (!in.is_cuda() && !bad.item<bool>()) return in;  // CPU memory: a good input needs no clamped copy
  record_input_error(op, what.c_str(), bad, bound);
  return at::clamp(in, 0, bound - 1);
}

int64_t host_read_count() { return host_reads.load(); }

std::string input_error_message(int64_t code, int64_t bound) {
  const std::lock_guard<std::mutex> lock(registry_mutex);
  const std::vector<std::string>& texts = error_texts();
  TORCH_CHECK_VALUE(code >= 1 && code <= static_cast<int64_t>(texts.size()), "no input error has code ", code);
  return bound < 0 ? texts[code - 1] : texts[code - 1] + " [0, " + std::to_string(bound) + ")";
}

namespace {

// ids_in_range for Python (the losses' deferred checks of their arguments): always a new tensor,
// since an op's output may not alias its input.
at::Tensor ids_in_range_op(const at::Tensor& ids, int64_t bound, c10::string_view op, c10::string_view name) {
  const std::string op_name(op), arg_name(name);
  const at::Tensor out = ids_in_range(op_name.c_str(), ids, bound, arg_name.c_str());
  return out.is_same(ids) ? out.clone() : out;
}

// int64 [2]: the flag of like's device, (code, bound) of its first error or zeros, then cleared.
at::Tensor take_input_error(const at::Tensor& like) {
  at::Tensor flag = device_flag(like.device());
  at::Tensor taken = flag.clone();
  flag.zero_();
  return taken;
}

}  // namespace
}  // namespace pnn_fast

// Device-agnostic (ATen ops only), registered for both backends like every op.
TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("take_input_error", &pnn_fast::take_input_error);
  m.impl("ids_in_range", &pnn_fast::ids_in_range_op);
}

#ifdef PNN_FAST_WITH_CUDA
TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("take_input_error", &pnn_fast::take_input_error);
  m.impl("ids_in_range", &pnn_fast::ids_in_range_op);
}
#endif
