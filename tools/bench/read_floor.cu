// fa_read_floor: the floor under step 08's decoding kernel, measured. A kernel that reads
// K and V once and computes nothing, with step 08's own copy (step 06's copy_tile_async:
// 64-key tiles at d = 128, bf16, 16-byte cp.async into swizzled shared memory, 128 threads
// a block, a ring of tiles, one block an SM), timed as tools/bench/ab.py times a call (the
// L2 flushed by zeroing 128 MiB, a 200 µs spin to hide the launch, CUDA events, the median
// of the repeats). Note 08, "The floor, measured", compares step 08 and cuDNN with it.
//
// The cuts of the tiles among blocks (K and V laid head after head, so a cut is a range
// of tiles):
//   static  block b reads tiles [b·T/B, (b+1)·T/B): one contiguous run a block, as step
//           08's plan cuts them (B = 128 at its decoding shapes; or one block an SM);
//   flow    blocks, one an SM, take chunks of C tiles from a counter (atomicAdd) until
//           none is left, the ring flowing across chunks (a chunk's id asked for two
//           chunks ahead): every block busy to the end;
//   tail    the static cut's first 75–95% of each block's share, then the rest as flow
//           hands it out: a block that fell behind takes less of the tail;
//   bulk    (Hopper) the static cut with each tile of K and of V one bulk copy (the TMA's
//           one-dimensional cp.async.bulk, completing on an mbarrier) issued by one thread.
// The static cut is also read by fewer blocks with deeper rings (64 or 96 blocks, six
// tiles), by two blocks an SM (a ring of three), and (Hopper) launched in thread block
// clusters of 2 to 16, as a plan that merges its units' parts in clusters would launch it:
// how many SMs, placed how, read at the floor's rate. The clusters the GPU holds at once
// are printed to stderr for each clustered cut.
// Each block's first and last instant (%globaltimer) are kept, so the spread of the
// blocks' ends is printed beside the time.
// --work-ns W stands in for step 08's math: after each tile's barrier every thread of
// the block spins W ns (by its SM's clock) before it waits for the next, so a block
// consumes at most a tile every W ns, however much of the HBM it is given. Does the cut
// still read at the floor's rate when its blocks cannot catch up fast?
//
//   fa_read_floor [--bh-kv 4,16,32,128] [--n-kv 8192,...] [--reps 15] [--work-ns 0,600] > floor.csv
#include <cuda_runtime.h>

#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_check.cuh"
#include "common/cuda/mma.cuh"
#include "steps/08_split_kv/step08.hpp"

namespace {

using fa::step08::kThreads;   // step 08's block: 128 threads
using fa::step08::kTileKeys;  // and its K/V tile: 64 keys
constexpr int kD = 128;
constexpr int kW = fa::mma::smem_cols(kD);
using T = __nv_bfloat16;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "fa_read_floor: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

struct BlockTimes {
  unsigned long long start, end;  // %globaltimer, ns
  long long tiles;                // tiles this block read
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// The block's stand-in for a tile's math: every thread spins `cycles` clocks of its SM.
__device__ __forceinline__ void work(long long cycles) {
  if (cycles == 0) return;
  const long long c0 = clock64();
  while (clock64() - c0 < cycles) {
  }
}

/// Tile `tile` of K and of V into slot `slot` of the ring, as step 08's split kernel copies
/// a tile. The heads lie end to end (N_kv a multiple of 64 here), so tile t is the 64 keys
/// at key row 64t of the whole K (and V), whichever head they belong to.
template <int kStages>
__device__ __forceinline__ void load_tile(T* ring, const T* k, const T* v, long long tile, int slot) {
#if FA_MMA_ARCH_OK
  const std::size_t from = std::size_t(tile) * kTileKeys * kD;
  T* ks = ring + slot * kTileKeys * kW;
  fa::mma::copy_tile_async<kThreads, kD, kTileKeys, true>(ks, k + from, kTileKeys);
  fa::mma::copy_tile_async<kThreads, kD, kTileKeys, true>(ks + kStages * kTileKeys * kW, v + from, kTileKeys);
#endif
}

/// static: block b streams tiles [b·T/B, (b+1)·T/B) through a ring of kStages tiles.
template <int kStages>
__global__ void __launch_bounds__(kThreads)
    read_static(const T* k, const T* v, long long tiles, long long cycles, BlockTimes* times) {
#if FA_MMA_ARCH_OK
  extern __shared__ __align__(1024) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);
  const unsigned long long start = global_ns();
  const long long t0 = blockIdx.x * tiles / gridDim.x, t1 = (blockIdx.x + 1) * tiles / gridDim.x;
  for (int s = 0; s < kStages - 1; ++s) {
    if (t0 + s < t1) load_tile<kStages>(ring, k, v, t0 + s, s);
    fa::mma::cp_async_commit();
  }
  for (long long t = t0; t < t1; ++t) {  // step 08's loop without the math
    fa::mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    const long long next = t + kStages - 1;
    if (next < t1) load_tile<kStages>(ring, k, v, next, int((next - t0) % kStages));
    fa::mma::cp_async_commit();
    work(cycles);
  }
  fa::mma::cp_async_wait<0>();
  if (threadIdx.x == 0) times[blockIdx.x] = {start, global_ns(), t1 - t0};
#endif
}

/// flow and tail: block b first streams `lead` tiles of its own, [b·lead, (b+1)·lead)
/// (flow: none), then takes chunks of kChunk of the tiles after all blocks' leads from
/// `counter` until none is left, the ring flowing from one chunk into the next. Thread 0
/// asks for a chunk's id two chunks before the loader reaches it and keeps the answer in
/// a register for a chunk, then stores it in `ids` (a ring of 16 ids), so no thread
/// waits on the atomic. The ring's slots are counted as they go and a chunk's size is a
/// power of two known at compile time, so the loop divides by shifts, not `div`.
template <int kStages, int kChunk>
__global__ void __launch_bounds__(kThreads)
    read_flow(const T* k, const T* v, long long tiles, int lead, long long cycles, unsigned* counter,
              BlockTimes* times) {
#if FA_MMA_ARCH_OK
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ long long ids[16];
  T* ring = reinterpret_cast<T*>(smem);
  const unsigned long long start = global_ns();
  // Block b's own tiles from `first`; the pool handed out in chunks from `pool` on.
  const long long first = static_cast<long long>(blockIdx.x) * lead, pool = static_cast<long long>(gridDim.x) * lead;
  const long long chunks = (tiles - pool + kChunk - 1) / kChunk;
  unsigned pending = 0;  // (thread 0) the id asked for at the last event
  // At the loader's position `at`, two chunks before chunk c's first tile: ask for chunk
  // c's id, and store chunk c − 1's (asked for a chunk ago).
  auto events = [&](int at) {
    const int x = at - lead + 2 * kChunk;
    if (x < 0 || unsigned(x) % kChunk != 0) return;
    if (x >= kChunk) ids[(unsigned(x) / kChunk - 1) % 16] = pending;
    pending = atomicAdd(counter, 1u);
  };
  // The tile at position j of this block's stream; -1: no chunk left (the stream ends);
  // -2: past the last tile inside the last chunk.
  auto tile_at = [&](int j) -> long long {
    if (j < lead) return first + j;
    const unsigned x = unsigned(j - lead);
    const long long c = ids[(x / kChunk) % 16], t = pool + c * kChunk + x % kChunk;
    return c >= chunks ? -1 : t < tiles ? t : -2;
  };
  if (threadIdx.x == 0)  // the events before the loop's first position (and before position 0)
    for (int at = lead - 2 * kChunk < 0 ? lead - 2 * kChunk : 0; at < kStages - 1; ++at) events(at);
  __syncthreads();
  for (int s = 0; s < kStages - 1; ++s) {
    const long long t = tile_at(s);
    if (t >= 0) load_tile<kStages>(ring, k, v, t, s);
    fa::mma::cp_async_commit();
  }
  long long done = 0;
  int next_slot = kStages - 1;  // the loader's slot
  for (int j = 0;; ++j) {
    fa::mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    const int at = j + kStages - 1;  // the loader's position
    if (threadIdx.x == 0) events(at);
    const long long t = tile_at(at);
    if (t >= 0) load_tile<kStages>(ring, k, v, t, next_slot);
    fa::mma::cp_async_commit();
    next_slot = next_slot + 1 == kStages ? 0 : next_slot + 1;
    const long long mine = tile_at(j);
    if (mine == -1) break;
    done += mine >= 0;
    if (mine >= 0) work(cycles);
  }
  fa::mma::cp_async_wait<0>();
  if (threadIdx.x == 0) times[blockIdx.x] = {start, global_ns(), done};
#endif
}

/// bulk (Hopper): the static cut, each tile of K and of V copied by one bulk copy
/// (cp.async.bulk, the TMA's one-dimensional form: a 64-key tile of a head is 16 KiB
/// contiguous) that completes on the slot's mbarrier, issued by thread 0; the block waits
/// on the barrier where step 08 waits on its cp.async group. Unswizzled: nothing reads it.
template <int kStages>
__global__ void __launch_bounds__(kThreads)
    read_bulk(const T* k, const T* v, long long tiles, long long cycles, BlockTimes* times) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ std::uint64_t full[kStages];
  T* ring = reinterpret_cast<T*>(smem);
  constexpr std::uint32_t kTileBytes = kTileKeys * kD * sizeof(T);
  const unsigned long long start = global_ns();
  const long long t0 = blockIdx.x * tiles / gridDim.x, t1 = (blockIdx.x + 1) * tiles / gridDim.x;
  auto issue = [&](long long t, int slot) {
    const std::size_t from = std::size_t(t) * kTileKeys * kD;
    T* ks = ring + slot * kTileKeys * kD;
    (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                               &full[slot], 2 * kTileBytes);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, ks, k + from, kTileBytes, &full[slot]);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, ks + kStages * kTileKeys * kD, v + from,
                             kTileBytes, &full[slot]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) cuda::ptx::mbarrier_init(&full[s], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    for (int s = 0; s < kStages - 1; ++s)
      if (t0 + s < t1) issue(t0 + s, s);
  }
  __syncthreads();
  for (long long t = t0; t < t1; ++t) {
    const long long j = t - t0;
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[j % kStages], std::uint32_t(j / kStages) & 1u)) {
    }
    __syncthreads();  // every thread past tile t - 1: its slot is free
    const long long next = t + kStages - 1;
    if (threadIdx.x == 0 && next < t1) issue(next, int((next - t0) % kStages));
    work(cycles);
  }
  if (threadIdx.x == 0) times[blockIdx.x] = {start, global_ns(), t1 - t0};
#endif
}

/// The GPU busy for `ns` nanoseconds: the host's launch work hides behind it, as ab.py's spin.
__global__ void spin(unsigned long long ns) {
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

/// "4,16,32": the numbers, or exit with a message naming the option.
std::vector<long long> parse_list(const std::string& option, const char* s) {
  std::vector<long long> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) {
    char* end = nullptr;
    out.push_back(std::strtoll(x.c_str(), &end, 10));
    if (x.empty() || *end != '\0') {
      std::fprintf(stderr, "fa_read_floor: %s %s: a list of whole numbers, such as 4,16\n", option.c_str(), s);
      std::exit(2);
    }
  }
  return out;
}

struct Cut {
  const char* name;  // static, flow, tail or bulk
  int stages;        // tiles in the ring
  int blocks;        // 0: one an SM
  int chunk;         // flow, tail: tiles a chunk
  int cluster = 1;   // static: blocks a thread block cluster (Hopper), as step 08 merges a unit's parts
  int lead_pct = 0;  // tail: the percent of an even share of the tiles each block streams first
};

/// Shared memory of a ring of `stages` tiles of K and of V.
std::size_t ring_bytes(int stages) { return 2 * std::size_t(stages) * kTileKeys * kW * sizeof(T); }

/// A static or bulk cut's kernel, by its ring (3, 4 or 6 tiles; bulk: 4 or 6): the one place
/// a cut's ring picks its template instance.
using ReadKernel = void (*)(const T*, const T*, long long, long long, BlockTimes*);
ReadKernel read_kernel(const Cut& c) {
  if (c.name == std::string("bulk")) return c.stages == 4 ? read_bulk<4> : read_bulk<6>;
  return c.stages == 3 ? read_static<3> : c.stages == 4 ? read_static<4> : read_static<6>;
}
/// A flow or tail cut's kernel, by its chunk (4 or 16 tiles; a ring of four).
using FlowKernel = void (*)(const T*, const T*, long long, int, long long, unsigned*, BlockTimes*);
FlowKernel flow_kernel(const Cut& c) { return c.chunk == 4 ? read_flow<4, 4> : read_flow<4, 16>; }

}  // namespace

int floor_main(int argc, char** argv) {
  std::vector<long long> heads = {4, 16, 32, 128}, keys = {8192, 16384, 32768, 65536, 131072};
  std::vector<long long> work_ns = {0};
  int reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--bh-kv") heads = parse_list(a, argv[i + 1]);
    else if (a == "--n-kv") keys = parse_list(a, argv[i + 1]);
    else if (a == "--reps") reps = int(parse_list(a, argv[i + 1]).at(0));
    else if (a == "--work-ns") work_ns = parse_list(a, argv[i + 1]);
    else {
      std::fprintf(stderr, "fa_read_floor: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "fa_read_floor: %s: a value expected after it\n", argv[argc - 1]);
    return 2;
  }
  if (reps < 1) {
    std::fprintf(stderr, "fa_read_floor: --reps %d: at least one repeat\n", reps);
    return 2;
  }
  for (long long n : keys)
    if (n <= 0 || n % kTileKeys != 0) {
      std::fprintf(stderr, "fa_read_floor: --n-kv %lld: a positive multiple of %d keys (whole tiles)\n", n, kTileKeys);
      return 2;
    }
  for (long long w : work_ns)
    if (w < 0 || w > 100000) {
      std::fprintf(stderr, "fa_read_floor: --work-ns %lld: 0 to 100000 ns a tile\n", w);
      return 2;
    }
  for (long long h : heads)
    if (h <= 0) {
      std::fprintf(stderr, "fa_read_floor: --bh-kv %lld: at least one head\n", h);
      return 2;
    }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "fa_read_floor: no CUDA GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  if (prop.major < 8) {
    std::fprintf(stderr, "fa_read_floor: step 08's copy needs sm_80 or newer; this GPU is sm_%d%d\n", prop.major,
                 prop.minor);
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  int clock_khz = 0;  // the SM's clock, for --work-ns
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  // (tail: the static cut's first 75, 90 or 95% of every block's share, the rest from the
  // counter, so that a block that fell behind takes less of the tail)
  std::vector<Cut> cuts = {{"static", 4, 128, 0},      {"static", 4, 0, 0},         {"static", 6, 128, 0},
                           {"flow", 4, 0, 4},          {"flow", 4, 0, 16},          {"tail", 4, 0, 16, 1, 75},
                           {"tail", 4, 0, 16, 1, 90}, {"tail", 4, 0, 4, 1, 95}};
  // Two blocks an SM (cuDNN's split kernel), and fewer blocks with deeper rings: how few SMs
  // read K and V at the floor's rate (a plan that merges every unit's parts in a cluster
  // makes fewer blocks: 32 units of 2, 16 of 4 or 6).
  cuts.insert(cuts.end(), {{"static", 3, 2 * sms, 0}, {"static", 4, 64, 0}, {"static", 6, 64, 0}, {"static", 6, 96, 0}});
  if (prop.major >= 9)  // Hopper: the bulk copy, and the same cuts launched in clusters
    cuts.insert(cuts.end(), {{"bulk", 4, 128, 0},
                             {"bulk", 4, 0, 0},
                             {"bulk", 6, 128, 0},
                             {"static", 4, 128, 0, 4},
                             {"static", 6, 64, 0, 2},
                             {"static", 6, 64, 0, 4},
                             {"static", 6, 96, 0, 6},
                             {"static", 4, 128, 0, 16},  // (16: beyond the portable 8)
                             {"static", 3, 256, 0, 8},
                             {"static", 3, 128, 0, 8},
                             {"static", 3, 128, 0, 4}});
  const std::size_t smem6 = ring_bytes(6);
  if (smem6 > prop.sharedMemPerBlockOptin) {
    std::fprintf(stderr, "fa_read_floor: a ring of six tiles takes %zu KiB of shared memory; this GPU gives %zu\n",
                 smem6 / 1024, std::size_t(prop.sharedMemPerBlockOptin) / 1024);
    return 1;
  }
  for (const Cut& c : cuts) {
    if (c.chunk) {
      check(cudaFuncSetAttribute(flow_kernel(c), cudaFuncAttributeMaxDynamicSharedMemorySize, int(ring_bytes(4))),
            "smem");
      continue;
    }
    check(cudaFuncSetAttribute(read_kernel(c), cudaFuncAttributeMaxDynamicSharedMemorySize, int(ring_bytes(c.stages))),
          "smem");
    if (c.cluster > fa::step08::kMaxCluster)  // (16: beyond the portable 8)
      check(cudaFuncSetAttribute(read_kernel(c), cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "cluster of 16");
  }
  for (const Cut& c : cuts)  // a cluster cut is the floor of a plan only if all its clusters run at once
    if (c.cluster > 1)
      std::fprintf(stderr, "fa_read_floor: %d blocks in clusters of %d (ring %d): %d clusters at once\n", c.blocks,
                   c.cluster, c.stages,
                   fa::max_active_clusters(read_kernel(c), c.cluster, kThreads, ring_bytes(c.stages)));
  std::size_t most = 0;
  for (long long h : heads)
    for (long long n : keys) most = std::max(most, std::size_t(h * n * kD * sizeof(T)));
  T *k = nullptr, *v = nullptr;
  void* flush = nullptr;
  unsigned* counter = nullptr;
  BlockTimes* times = nullptr;
  check(cudaMalloc(&k, most), "K");
  check(cudaMalloc(&v, most), "V");
  check(cudaMalloc(&flush, std::size_t(128) << 20), "the L2 flush buffer");
  check(cudaMalloc(&counter, sizeof(unsigned)), "counter");
  auto blocks_of = [&](const Cut& c) { return c.blocks ? c.blocks : sms; };
  int most_blocks = 0;  // of any cut: one BlockTimes a block
  for (const Cut& c : cuts) most_blocks = std::max(most_blocks, blocks_of(c));
  check(cudaMalloc(&times, std::size_t(most_blocks) * sizeof(BlockTimes)), "times");
  check(cudaMemset(k, 0x3c, most), "K");  // (the values do not matter: nothing is computed)
  check(cudaMemset(v, 0x3c, most), "V");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");

  std::printf("gpu,bh_kv,n_kv,d,bytes,cut,ring,blocks,chunk_tiles,cluster,ms,gbps,first_end_us,median_end_us,"
              "last_end_us,work_ns,lead_pct\n");
  for (long long w : work_ns)
    for (long long h : heads)
      for (long long n : keys) {
        const long long cycles = w * clock_khz / 1000000;
        const long long tiles = h * n / kTileKeys;
        const double bytes = 2.0 * double(h) * double(n) * kD * sizeof(T);
        for (const Cut& c : cuts) {
          const int blocks = blocks_of(c);
          auto launch = [&] {  // (the counter zeroed before)
            const std::size_t smem = ring_bytes(c.stages);
            if (c.chunk)
              flow_kernel(c)<<<blocks, kThreads, smem>>>(k, v, tiles, int(tiles / blocks * c.lead_pct / 100), cycles,
                                                         counter, times);
            else if (c.cluster > 1)
              fa::launch_clustered(c.cluster, read_kernel(c), blocks, kThreads, smem, 0, k, v, tiles, cycles, times);
            else read_kernel(c)<<<blocks, kThreads, smem>>>(k, v, tiles, cycles, times);
          };
          check(cudaMemsetAsync(counter, 0, sizeof(unsigned)), "counter");
          launch();  // a warm-up
          check(cudaDeviceSynchronize(), "warm-up");
          std::vector<float> ms;
          for (int r = 0; r < reps; ++r) {
            check(cudaMemsetAsync(flush, 0, std::size_t(128) << 20), "flush");
            check(cudaMemsetAsync(counter, 0, sizeof(unsigned)), "counter");
            spin<<<1, 1>>>(200000);
            check(cudaEventRecord(e0), "event");
            launch();
            check(cudaEventRecord(e1), "event");
            check(cudaEventSynchronize(e1), "the timed kernel");
            float x = 0;
            check(cudaEventElapsedTime(&x, e0, e1), "elapsed");
            ms.push_back(x);
          }
          std::sort(ms.begin(), ms.end());
          std::vector<BlockTimes> bt(blocks);
          check(cudaMemcpy(bt.data(), times, blocks * sizeof(BlockTimes), cudaMemcpyDeviceToHost), "times");
          unsigned long long first = ~0ull;
          long long read = 0;
          for (const BlockTimes& b : bt) first = std::min(first, b.start), read += b.tiles;
          if (read != tiles) {
            std::fprintf(stderr, "fa_read_floor: %s read %lld tiles of %lld\n", c.name, read, tiles);
            return 1;
          }
          std::vector<double> ends;
          for (const BlockTimes& b : bt) ends.push_back((b.end - first) / 1e3);
          std::sort(ends.begin(), ends.end());
          const double med = ms[ms.size() / 2];
          std::printf("%s,%lld,%lld,%d,%.0f,%s,%d,%d,%d,%d,%.5f,%.1f,%.1f,%.1f,%.1f,%lld,%d\n", prop.name, h, n, kD,
                      bytes, c.name, c.stages, blocks, c.chunk, c.cluster, med, bytes / med / 1e6, ends.front(),
                      ends[ends.size() / 2], ends.back(), w, c.lead_pct);
        }
      }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return floor_main(argc, argv);
  } catch (const fa::Error& e) {  // (a cluster launch or count, checked by FA_CUDA_CHECK)
    std::fprintf(stderr, "fa_read_floor: %s\n", e.what());
    return 1;
  }
}
