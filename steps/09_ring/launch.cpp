// ring09: starts one process a GPU for step 09's ring over NCCL.
//
//   ring09 --ranks R -- PROGRAM [ARGS...]
//
// Makes one NCCL unique id, then starts R copies of PROGRAM with FA_RANK = 0 … R − 1,
// FA_RANKS = R and the id (FA_NCCL_ID) in their environment; each takes GPU FA_RANK
// (NcclRing). NVLink multicast (NVLS) is turned off unless the caller set
// NCCL_NVLS_ENABLE. Each rank's output goes to a file and is printed after the ranks
// end, rank by rank; if one rank fails, the others are stopped (they would wait for it
// in NCCL for ever). Exit status: 0 when every rank returned 0; 77 ("Not Run" to CTest)
// when this machine has fewer than R GPUs or none; otherwise that of the first rank to
// fail (77 again when its GPU cannot run the step).
#include <nccl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "steps/09_ring/nccl.hpp"

extern char** environ;

namespace {

constexpr int kNotRun = 77;

int usage() {
  std::cerr << "usage: ring09 --ranks R -- PROGRAM [ARGS...]  (R processes, one a GPU, for step 09's ring over NCCL)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0, first = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--") == 0) {
      first = i + 1;
      break;
    } else {
      return usage();
    }
  }
  if (ranks < 1 || first < 0 || first >= argc) return usage();

  int gpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus < ranks) {
    std::cout << "ring09: " << ranks << " rank(s) need " << ranks << " GPU(s); this machine has "
              << (e == cudaSuccess ? std::to_string(gpus) : std::string("none (") + cudaGetErrorString(e) + ")")
              << ": not run\n";
    return kNotRun;
  }
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    std::cerr << "ring09: ncclGetUniqueId: " << ncclGetErrorString(r) << "\n";
    return 1;
  }
  setenv(fa::step09::LaunchEnv::kId, fa::step09::encode_id(id).c_str(), 1);
  setenv(fa::step09::LaunchEnv::kRanks, std::to_string(ranks).c_str(), 1);
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // the device notes: NVLink multicast stays off

  std::vector<pid_t> pid(ranks, -1);
  std::vector<std::string> log(ranks);
  int status = 0;
  for (int r = 0; r < ranks && status == 0; ++r) {
    char name[] = "/tmp/ring09.XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) {
      std::perror("ring09: mkstemp");
      status = 1;
      break;
    }
    log[r] = name;
    setenv(fa::step09::LaunchEnv::kRank, std::to_string(r).c_str(), 1);
    posix_spawn_file_actions_t io;
    posix_spawn_file_actions_init(&io);
    posix_spawn_file_actions_adddup2(&io, fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&io, fd, STDERR_FILENO);
    if (const int err = posix_spawnp(&pid[r], argv[first], &io, nullptr, argv + first, environ); err != 0) {
      std::cerr << "ring09: cannot start " << argv[first] << ": " << std::strerror(err) << "\n";
      pid[r] = -1;
      status = 1;
      for (pid_t p : pid)  // the ranks already started would wait for this one in NCCL for ever
        if (p > 0) kill(p, SIGTERM);
    }
    posix_spawn_file_actions_destroy(&io);
    close(fd);
  }
  int left = 0;
  for (pid_t p : pid) left += p > 0;
  while (left > 0) {
    int ws = 0;
    const pid_t done = wait(&ws);
    if (done < 0) break;
    --left;
    const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    int r = 0;
    while (r < ranks && pid[r] != done) ++r;
    if (r < ranks) pid[r] = -1;
    if (code != 0 && status == 0) {  // the first failure (or Not Run) decides; the others would wait for ever
      status = code;
      if (left > 0) std::cout << "ring09: rank " << r << " exited with " << code << "; stopping the others\n";
      for (pid_t p : pid)
        if (p > 0) kill(p, SIGTERM);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (log[r].empty()) continue;
    std::ifstream in(log[r]);
    std::string line;
    while (std::getline(in, line)) std::cout << "[rank " << r << "] " << line << "\n";
    std::remove(log[r].c_str());
  }
  return status;
}
