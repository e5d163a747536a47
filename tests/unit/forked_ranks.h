// RunForkedRanks: runs body(rank) for rank 0..world-1, each in a forked process, and returns each
// child's exit code (0: passed; 128 + N: killed by signal N). A child that hangs (a collective or a
// rendezvous that never completes) is killed by its 60 s alarm instead of hanging the test run.
// For tests of multi-rank communicators: every rank is a real process, as in a fleet.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <vector>

namespace orrery {

inline std::vector<int> RunForkedRanks(int world, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(60);
      _exit(body(r));
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

}  // namespace orrery
