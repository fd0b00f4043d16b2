#include "common/gpu.hpp"
#include "common/gpu16.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/compare.hpp"
#include "common/cuda_check.cuh"
#include "common/device_buffer.cuh"
#include "common/timer.cuh"

namespace fa::gpu {

bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device present";
    return false;
  }
  return true;
}

std::string describe_device() {
  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDevice(&dev));
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  FA_CUDA_CHECK(cudaDriverGetVersion(&driver));
  FA_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::ostringstream s;
  s << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount
    << " SMs), CUDA driver API " << driver / 1000 << "." << (driver % 1000) / 10 << ", runtime "
    << runtime / 1000 << "." << (runtime % 1000) / 10;
  return s.str();
}

namespace {
int device_attribute(cudaDeviceAttr what) {  // of the current device
  int dev = 0, value = 0;
  FA_CUDA_CHECK(cudaGetDevice(&dev));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&value, what, dev));
  return value;
}
}  // namespace

int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }
std::size_t smem_per_sm() { return std::size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor)); }
std::size_t smem_per_block() { return std::size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)); }
std::size_t l2_bytes() { return std::size_t(device_attribute(cudaDevAttrL2CacheSize)); }

namespace {
__global__ void arch_kernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#endif
}
}  // namespace

int device_code_arch() {
  DeviceBuffer<int> b(std::vector<int>{0});
  arch_kernel<<<1, 1>>>(b.get());
  FA_CHECK_LAUNCH();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return b.download()[0] / 10;
}

int compute_capability() {
  return 10 * device_attribute(cudaDevAttrComputeCapabilityMajor) + device_attribute(cudaDevAttrComputeCapabilityMinor);
}

std::string too_old(int min_sm, bool exact) {
  const int cc = compute_capability();
  if (exact ? cc == min_sm : cc >= min_sm) return {};
  int dev = 0;
  cudaDeviceProp prop{};
  FA_CUDA_CHECK(cudaGetDevice(&dev));
  FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const std::string sm = std::to_string(min_sm);
  const std::string which = exact ? " (its kernels are sm_" + sm + "a code, which no other architecture runs)"
                                  : " or newer (sm_" + sm + "+; it is compiled out of older architectures)";
  return "needs a GPU of compute capability " + std::to_string(min_sm / 10) + "." + std::to_string(min_sm % 10) +
         which + ", and this " + prop.name + " is sm_" + std::to_string(cc);
}

namespace {

unsigned takes(const GpuForward& s) {
  return (s.decode ? Problem::kDecode : 0u) | (s.groups ? Problem::kGroups : 0u) | (s.window ? Problem::kWindow : 0u);
}
unsigned takes(const GpuBackward& s) {
  return (s.groups ? Problem::kGroups : 0u) | (s.window ? Problem::kWindow : 0u);
}

template <class Step>
void check_supported(const Step& s, const Problem& p) {
  p.validate_for(s.name, takes(s));
  if (!takes_d(s.max_d, s.only_d, p.d)) {
    if (!s.only_d)  // a range: 1..max_d
      throw Error(std::string(s.name) + " supports head dimensions up to d = " + std::to_string(s.max_d) +
                  " (got d = " + std::to_string(p.d) + ")");
    throw Error(std::string(s.name) + " supports d = " + d_list(s.only_d) + " (got d = " + std::to_string(p.d) + ")");
  }
  if (p.heads() > 65535) throw Error(std::string(s.name) + ": B·H must be at most 65535 (one grid dimension)");
  std::string why;
  if (!available(&why)) throw Error(std::string(s.name) + " needs a GPU: " + why);
  why = too_old(s.min_sm, s.exact_sm);
  if (!why.empty()) throw Error(std::string(s.name) + " " + why);
}

std::string gib(std::size_t bytes) {
  std::ostringstream s;
  s.precision(3);
  s << double(bytes) / double(1ull << 30) << " GiB";
  return s.str();
}

// Refuse, with the numbers, instead of failing inside cudaMalloc or a kernel.
void check_memory(const char* name, std::size_t need, std::size_t workspace, const char* what) {
  std::size_t free = 0, total = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  if (need > free) {
    std::string msg = std::string(name) + " needs " + gib(need) + " of device memory";
    if (workspace) msg += std::string(" (") + gib(workspace) + " of it for " + what + ")";
    msg += " but only " + gib(free) + " of " + gib(total) + " is free";
    throw Error(msg);
  }
}


template <class Step>
void check_dtype(const Step& s, const Problem& p) {
  if (p.dtype == DType::fp32 && !s.run)
    throw Error(std::string(s.name) + " computes in 16 bits: choose bf16 or fp16 (--dtype)");
  if (p.dtype != DType::fp32 && !s.run_native)
    throw Error(std::string(s.name) + " computes in fp32 only (got " + dtype_name(p.dtype) + ")");
}

std::uint16_t to16(DType t, float x) {
  if (t == DType::bf16) return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
  return __half_raw(__float2half_rn(x)).x;
}
float from16(DType t, std::uint16_t b) {
  if (b == kPoison16) return poison_value();
  if (t == DType::bf16) {
    __nv_bfloat16_raw r;
    r.x = b;
    return __bfloat162float(__nv_bfloat16(r));
  }
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}
std::size_t elem_bytes(const Problem& p) { return p.dtype == DType::fp32 ? 4 : 2; }

// n values uniform in [-1, 1) in 16 bits, drawn on the device (a hash of the index and
// seed: splitmix64's finaliser), for timing.
__global__ void random16_kernel(std::uint16_t* x, std::size_t n, std::uint64_t seed, bool bf16) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const float u = float((z ^ (z >> 31)) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    x[i] = bf16 ? __nv_bfloat16_raw(__float2bfloat16_rn(u)).x : __half_raw(__float2half_rn(u)).x;
  }
}
DeviceBuffer<std::uint16_t> random16(DType t, std::size_t n, std::uint64_t seed) {
  DeviceBuffer<std::uint16_t> b(n);
  random16_kernel<<<1024, 256>>>(b.get(), n, seed, t == DType::bf16);
  FA_CHECK_LAUNCH();
  return b;
}

}  // namespace

void check_runnable(const GpuForward& s, const Problem& p) {
  check_supported(s, p);
  check_dtype(s, p);
}
void check_runnable(const GpuBackward& s, const Problem& p) {
  check_supported(s, p);
  check_dtype(s, p);
}

DeviceBuffer<float> poisoned(std::size_t n) {
  DeviceBuffer<float> b(n);
  std::vector<float> h(n, poison_value());
  b.upload(h);
  return b;
}

namespace {
/// A step's workspace, every byte 0xFF (NaN as a float, −1 as an int): a step must set
/// whatever of it it reads (a dQ accumulator it adds into, counters it waits on), never
/// count on fresh memory being zero.
DeviceBuffer<char> poisoned_workspace(std::size_t bytes) {
  DeviceBuffer<char> ws(bytes);
  if (bytes) FA_CUDA_CHECK(cudaMemset(ws.get(), 0xFF, bytes));
  return ws;
}
}  // namespace

DeviceBuffer<std::uint16_t> upload16(DType t, const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = to16(t, x[i]);
  return DeviceBuffer<std::uint16_t>(h);
}
std::vector<float> download16(DType t, const DeviceBuffer<std::uint16_t>& b) {
  const std::vector<std::uint16_t> h = b.download();
  std::vector<float> x(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) x[i] = from16(t, h[i]);
  return x;
}

std::size_t forward_bytes(const GpuForward& s, const Problem& p) {
  return (2 * p.elems() + 2 * p.kv_elems()) * elem_bytes(p) + p.rows() * sizeof(float) + s.workspace_bytes(p);
}

std::size_t backward_bytes(const GpuBackward& s, const Problem& p) {
  return (6 * p.elems() + 4 * p.kv_elems()) * elem_bytes(p) + p.rows() * sizeof(float) + s.workspace_bytes(p);
}

namespace {
/// A ragged batch's sequences, once `step` is known to take one (ragged_workspace_bytes) and
/// the offsets checked: what the host wrappers below check first.
template <class Step>
int ragged_sequences(const Step& s, const Problem& p, const std::vector<int>& offsets) {
  if (!s.ragged_workspace_bytes) throw Error(std::string(s.name) + " does not take a ragged batch");
  require_offsets(p, offsets);
  if (p.dtype == DType::fp32) throw Error(std::string(s.name) + " takes a ragged batch in 16 bits only");
  return int(offsets.size()) - 1;
}

/// A 16-bit forward: inputs rounded on the way in, outputs poisoned, the offsets uploaded where
/// there are some (a ragged batch), the table and lengths where K and V are a paged cache.
ForwardOut forward16(const GpuForward& s, const Problem& p, const Qkv& in, std::size_t ws_bytes,
                     const std::vector<int>* offsets, const PagedKv* kv = nullptr) {
  DeviceBuffer<std::uint16_t> q = upload16(p.dtype, in.q), k = upload16(p.dtype, in.k), v = upload16(p.dtype, in.v);
  DeviceBuffer<std::uint16_t> o(std::vector<std::uint16_t>(p.elems(), kPoison16));
  DeviceBuffer<float> lse = poisoned(p.rows());
  DeviceBuffer<int> offs = offsets ? DeviceBuffer<int>(*offsets) : DeviceBuffer<int>();
  DeviceBuffer<int> table = kv ? DeviceBuffer<int>(kv->table) : DeviceBuffer<int>();
  DeviceBuffer<int> lengths = kv && !kv->lengths.empty() ? DeviceBuffer<int>(kv->lengths) : DeviceBuffer<int>();
  DeviceBuffer<char> ws = poisoned_workspace(ws_bytes);
  const Ragged ragged = offsets ? Ragged{offs.get(), int(offsets->size()) - 1} : Ragged{};
  const Paged paged = kv ? Paged{table.get(), lengths.get(), kv->page, kv->pool} : Paged{};
  s.run_native(p, NativeFwdArgs{q.get(), k.get(), v.get(), o.get(), lse.get(), ragged, paged}, ws.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return {download16(p.dtype, o), lse.download()};
}

/// A 16-bit backward, as forward16.
Grads backward16(const GpuBackward& s, const Problem& p, const Qkv& in, const ForwardOut& fwd,
                 const std::vector<float>& dout, std::size_t ws_bytes, const std::vector<int>* offsets) {
  const DType t = p.dtype;
  DeviceBuffer<std::uint16_t> q = upload16(t, in.q), k = upload16(t, in.k), v = upload16(t, in.v);
  DeviceBuffer<std::uint16_t> o = upload16(t, fwd.o), dO = upload16(t, dout);
  DeviceBuffer<float> lse(fwd.lse);
  const std::vector<std::uint16_t> poison(p.elems(), kPoison16), poison_kv(p.kv_elems(), kPoison16);
  DeviceBuffer<std::uint16_t> dq(poison), dk(poison_kv), dv(poison_kv);
  DeviceBuffer<int> offs = offsets ? DeviceBuffer<int>(*offsets) : DeviceBuffer<int>();
  DeviceBuffer<char> ws = poisoned_workspace(ws_bytes);
  const Ragged ragged = offsets ? Ragged{offs.get(), int(offsets->size()) - 1} : Ragged{};
  s.run_native(p,
               NativeBwdArgs{q.get(), k.get(), v.get(), o.get(), lse.get(), dO.get(), dq.get(), dk.get(), dv.get(),
                             ragged},
               ws.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return {download16(t, dq), download16(t, dk), download16(t, dv)};
}
}  // namespace

ForwardOut forward(const GpuForward& s, const Problem& p, const Qkv& in, bool softmax) {
  check_runnable(s, p);
  const std::size_t ws_bytes = s.workspace_bytes(p);
  check_memory(s.name, forward_bytes(s, p), ws_bytes, s.workspace_what);
  if (p.dtype != DType::fp32) return forward16(s, p, in, ws_bytes, nullptr);  // 16 bits on the device
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v);
  DeviceBuffer<float> o = poisoned(p.elems());
  DeviceBuffer<float> lse = softmax ? poisoned(p.rows()) : DeviceBuffer<float>();
  DeviceBuffer<char> ws = poisoned_workspace(ws_bytes);
  s.run(p, FwdArgs{q.get(), k.get(), v.get(), o.get(), lse.get()}, ws.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return {o.download(), softmax ? lse.download() : std::vector<float>{}};
}

ForwardOut forward(const GpuForward& s, const Problem& p, const Qkv& in, const std::vector<int>& offsets) {
  check_runnable(s, p);
  const int sequences = ragged_sequences(s, p, offsets);  // before ragged_workspace_bytes is called
  const std::size_t ws_bytes = s.ragged_workspace_bytes(p, sequences);
  check_memory(s.name, forward_bytes(s, p) - s.workspace_bytes(p) + ws_bytes, ws_bytes, "a ragged batch's table");
  return forward16(s, p, in, ws_bytes, &offsets);
}

ForwardOut forward_paged(const GpuForward& s, const Problem& p, const Qkv& in, const PagedKv& kv) {
  check_runnable(s, p);
  if (!s.paged) throw Error(std::string(s.name) + " does not take a paged K/V cache");
  if (p.dtype == DType::fp32) throw Error(std::string(s.name) + " takes a paged cache in 16 bits only");
  kv.validate(p, in.k.size());
  if (in.v.size() != in.k.size()) throw Error("the pools of K and V must be the same size");
  const std::size_t ws_bytes = s.workspace_bytes(p), pools = 2 * in.k.size() * elem_bytes(p);
  const std::size_t tables = (kv.table.size() + kv.lengths.size()) * sizeof(int);
  check_memory(s.name, forward_bytes(s, p) - 2 * p.kv_elems() * elem_bytes(p) + pools + tables, ws_bytes,
               s.workspace_what);
  return forward16(s, p, in, ws_bytes, nullptr, &kv);
}

Grads backward(const GpuBackward& s, const Problem& p, const Qkv& in, const ForwardOut& fwd,
               const std::vector<float>& dout) {
  check_runnable(s, p);
  const std::size_t ws_bytes = s.workspace_bytes(p);
  check_memory(s.name, backward_bytes(s, p), ws_bytes, s.workspace_what);
  if (p.dtype != DType::fp32) return backward16(s, p, in, fwd, dout, ws_bytes, nullptr);
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), o(fwd.o), lse(fwd.lse), dO(dout);
  DeviceBuffer<float> dq = poisoned(p.elems()), dk = poisoned(p.kv_elems()), dv = poisoned(p.kv_elems());
  DeviceBuffer<char> ws = poisoned_workspace(ws_bytes);
  s.run(p, BwdArgs{q.get(), k.get(), v.get(), o.get(), lse.get(), dO.get(), dq.get(), dk.get(), dv.get()},
        ws.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return {dq.download(), dk.download(), dv.download()};
}

Grads backward(const GpuBackward& s, const Problem& p, const Qkv& in, const ForwardOut& fwd,
               const std::vector<float>& dout, const std::vector<int>& offsets) {
  check_runnable(s, p);
  const int sequences = ragged_sequences(s, p, offsets);  // before ragged_workspace_bytes is called
  const std::size_t ws_bytes = s.ragged_workspace_bytes(p, sequences);
  check_memory(s.name, backward_bytes(s, p) - s.workspace_bytes(p) + ws_bytes, ws_bytes,
               "a ragged batch's tables and sums");
  return backward16(s, p, in, fwd, dout, ws_bytes, &offsets);
}

namespace {
template <class Launch>
Timing time_launches(Launch&& launch, int reps) {
  if (reps == 0) {  // one untimed launch, nothing else on the GPU: what a profiler should see
    launch();
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    return {};
  }
  L2Flusher l2;
  EventTimer timer;
  for (int i = 0; i < 2; ++i) launch();  // warm-up: module load, first-touch
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    l2.flush();
    timer.start();
    launch();
    ms.push_back(timer.stop());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), reps};
}
}  // namespace

Timing time_forward(const GpuForward& s, const Problem& p, int reps) {
  check_runnable(s, p);
  check_memory(s.name, forward_bytes(s, p), s.workspace_bytes(p), s.workspace_what);
  if (p.dtype != DType::fp32) {
    // Inputs made on the device: a decoding problem's K/V cache (gigabytes) would take
    // longer to draw and upload than to time.
    DeviceBuffer<std::uint16_t> q = random16(p.dtype, p.elems(), 7), k = random16(p.dtype, p.kv_elems(), 8),
                                v = random16(p.dtype, p.kv_elems(), 9);
    DeviceBuffer<std::uint16_t> o(p.elems());
    DeviceBuffer<float> lse(p.rows());
    DeviceBuffer<char> ws(s.workspace_bytes(p));
    return time_launches(
        [&] { s.run_native(p, {q.get(), k.get(), v.get(), o.get(), lse.get()}, ws.get(), nullptr); }, reps);
  }
  const Qkv in = random_qkv(p, 7);
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), o(p.elems()), lse(p.rows());
  DeviceBuffer<char> ws(s.workspace_bytes(p));
  return time_launches([&] { s.run(p, {q.get(), k.get(), v.get(), o.get(), lse.get()}, ws.get(), nullptr); },
                       reps);
}

Timing time_backward(const GpuBackward& s, const Problem& p, int reps) {
  check_runnable(s, p);
  check_memory(s.name, backward_bytes(s, p), s.workspace_bytes(p), s.workspace_what);
  const Qkv in = random_qkv(p, 7);
  // O and L need not be a real forward's for timing: the arithmetic is the same.
  // (L = log N keeps P = e^(S − L) near 1/N, as a real forward's would be.)
  if (p.dtype != DType::fp32) {
    const DType t = p.dtype;
    DeviceBuffer<std::uint16_t> q = upload16(t, in.q), k = upload16(t, in.k), v = upload16(t, in.v);
    DeviceBuffer<std::uint16_t> o = upload16(t, in.q), dO = upload16(t, in.q);
    DeviceBuffer<float> lse(std::vector<float>(p.rows(), std::log(float(p.N))));
    DeviceBuffer<std::uint16_t> dq(p.elems()), dk(p.kv_elems()), dv(p.kv_elems());
    DeviceBuffer<char> ws(s.workspace_bytes(p));
    return time_launches(
        [&] {
          s.run_native(p, {q.get(), k.get(), v.get(), o.get(), lse.get(), dO.get(), dq.get(), dk.get(), dv.get()},
                       ws.get(), nullptr);
        },
        reps);
  }
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), o(in.q), dO(in.q);
  DeviceBuffer<float> lse(std::vector<float>(p.rows(), 1.0f));
  DeviceBuffer<float> dq(p.elems()), dk(p.kv_elems()), dv(p.kv_elems());
  DeviceBuffer<char> ws(s.workspace_bytes(p));
  return time_launches(
      [&] {
        s.run(p, {q.get(), k.get(), v.get(), o.get(), lse.get(), dO.get(), dq.get(), dk.get(), dv.get()}, ws.get(),
              nullptr);
      },
      reps);
}

}  // namespace fa::gpu
