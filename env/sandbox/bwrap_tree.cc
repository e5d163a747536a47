#include "env/sandbox/bwrap_tree.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <thread>

namespace orrery::env {

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return out;
  while (const dirent* t = readdir(dir)) {
    if (t->d_name[0] == '.') continue;
    FILE* f = std::fopen((tasks + "/" + t->d_name + "/children").c_str(), "re");
    if (f == nullptr) continue;
    long child = 0;
    while (std::fscanf(f, "%ld", &child) == 1) {
      if (child > 0) out.push_back(static_cast<pid_t>(child));
    }
    std::fclose(f);
  }
  closedir(dir);
  return out;
}

int KillChildrenOf(pid_t pid) {
  int killed = 0;
  for (const pid_t child : ChildrenOf(pid)) killed += kill(child, SIGKILL) == 0;
  return killed;
}

void KillBwrapTree(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  const auto until = std::chrono::steady_clock::now() + grace;
  // Repeated while bwrap lives: a bwrap still setting up may create its child after a pass.
  while (true) {
    KillChildrenOf(pid);
    siginfo_t info{};
    const int r = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r != 0 || info.si_pid == pid) break;  // exited (or not our child: nothing to wait for)
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
}

}  // namespace orrery::env
