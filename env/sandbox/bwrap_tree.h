#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace orrery::env {

// Ending a bubblewrap process tree so that nothing is left for the host's init to reap.
//
// bwrap is the parent of its pid namespace's pid 1 (with --as-pid-1, the sandboxed command), and
// with --new-session that child is in a session of its own, out of reach of a signal to bwrap's
// process group. Killing bwrap first orphans it: it dies (PR_SET_PDEATHSIG), but as a child of
// the host's pid 1, and where pid 1 does not reap (many container inits do not), its zombie stays
// and counts towards the sandbox uid's RLIMIT_NPROC until no sandbox of that uid can start
// ("Creating new namespace failed: Resource temporarily unavailable"). So the tree is ended from
// the inside out: the namespace's pid 1 first (its death kills every process in the namespace),
// then bwrap reaps it and exits by itself.

// The children of `pid` (every thread's, from /proc/<pid>/task/*/children); empty when it is
// gone. Also the resource watchdog's tree walk.
std::vector<pid_t> ChildrenOf(pid_t pid);

// Sends SIGKILL to each child of `pid` (for a bwrap, the namespace's pid 1); returns how many.
int KillChildrenOf(pid_t pid);

// Kills bwrap's children, waits up to `grace` for bwrap (a child of this process) to exit by
// itself, then sends SIGKILL to bwrap's process group. Does not reap bwrap: the caller does.
void KillBwrapTree(pid_t pid, std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

}  // namespace orrery::env
