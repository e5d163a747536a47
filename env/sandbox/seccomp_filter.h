// The seccomp filter every sandboxed process runs under (libseccomp, passed to bwrap --seccomp).
//
// Default allow; the calls a tool or agent program never needs and an escape would use fail with
// EPERM: ptrace, process_vm_readv/writev, mount/umount2/pivot_root/chroot and the new mount API,
// unshare/setns, kexec_load/kexec_file_load, bpf, perf_event_open, keyctl/add_key/request_key,
// init_module/finit_module/delete_module, reboot, swapon/swapoff, syslog, acct, userfaultfd,
// open_by_handle_at/name_to_handle_at, settimeofday/clock_settime/adjtimex, quotactl,
// personality, iopl/ioperm, io_uring_setup/enter/register. Beyond these:
//   - clone with a namespace flag (CLONE_NEWUSER, CLONE_NEWNET, ...: DeniedCloneFlags()) fails with
//     EPERM, and clone3 with ENOSYS (its flags are in memory, out of a filter's sight; glibc then
//     falls back to clone), so no new namespace can be made from inside, whatever bwrap's
//     --disable-userns already does;
//   - socket and socketpair for any family but AF_UNIX, AF_INET and AF_INET6 (AF_VSOCK, AF_NETLINK,
//     AF_PACKET, ...) fail with EAFNOSUPPORT.
// (Errors rather than a kill: programs see an ordinary failure and the test suite can assert it.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace orrery::env {

// The names of the system calls denied whatever their arguments, in the order above.
const std::vector<const char*>& DeniedSyscalls();
// The clone flags that make clone fail.
uint64_t DeniedCloneFlags();

// Compiles the filter to BPF and returns a file descriptor positioned at its start (a memfd
// without close-on-exec, as bwrap reads it in the child). The caller closes it.
StatusOr<int> MakeSeccompFilterFd();

}  // namespace orrery::env
