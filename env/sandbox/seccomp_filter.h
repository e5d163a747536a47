// The seccomp filter every sandboxed process runs under (libseccomp, passed to bwrap --seccomp).
//
// Default allow; the calls a tool or agent program never needs and an escape would use fail with
// EPERM: ptrace, process_vm_readv/writev, mount/umount2/pivot_root/chroot and the new mount API,
// unshare/setns, kexec_load/kexec_file_load, bpf, perf_event_open, keyctl/add_key/request_key,
// init_module/finit_module/delete_module, reboot, swapon/swapoff, syslog, acct, userfaultfd,
// open_by_handle_at/name_to_handle_at, settimeofday/clock_settime/adjtimex, quotactl,
// personality, iopl/ioperm. (EPERM rather than a kill: programs see an ordinary error and the
// test suite can assert it.)
#pragma once

#include <vector>

#include "core/status.h"

namespace orrery::env {

// The names of the denied system calls, in the order above.
const std::vector<const char*>& DeniedSyscalls();

// Compiles the filter to BPF and returns a file descriptor positioned at its start (a memfd
// without close-on-exec, as bwrap reads it in the child). The caller closes it.
StatusOr<int> MakeSeccompFilterFd();

}  // namespace orrery::env
