"""Start User-Mode Linux with ptrace of the extended FPU state turned off.

UML 6.1 saves a guest's FPU registers with ``PTRACE_GETREGSET`` /
``PTRACE_SETREGSET`` and ``NT_X86_XSTATE``; on CPUs with AVX-512 or AMX the
host's XSAVE area is larger than UML's buffer and the call fails
(``userspace - ptrace set fp regs failed, errno = 14``, then a panic).  UML
probes for XSTATE support once at boot and falls back to the x87/SSE
registers (``PTRACE_GETFPREGS``) when the probe fails, so a seccomp filter
that makes exactly those two requests fail with EIO is enough.  The guest
must then keep glibc off its AVX paths (see ``pc_kernel.GLIBC_NO_AVX``):
UML no longer preserves those registers between the guest's threads.

Usage: ``python launcher.py /usr/bin/linux.uml ARGS...`` (replaces itself
with UML; the filter is inherited by every process UML starts).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
NR_PTRACE = 101  # x86_64
PTRACE_GETREGSET, PTRACE_SETREGSET = 0x4204, 0x4205
NT_X86_XSTATE = 0x202
EIO = 5

LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
# offsets in struct seccomp_data: nr, arch, args[0] and args[2] (low words)
OFF_NR, OFF_ARCH, OFF_ARG0, OFF_ARG2 = 0, 4, 16, 32


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program() -> bytes:
    """BPF: ptrace(GETREGSET|SETREGSET, pid, NT_X86_XSTATE, ...) -> EIO; all else allowed."""
    return b"".join([
        _insn(LD_W_ABS, OFF_ARCH),
        _insn(JEQ_K, AUDIT_ARCH_X86_64, 0, 8),   # other ABI: allow
        _insn(LD_W_ABS, OFF_NR),
        _insn(JEQ_K, NR_PTRACE, 0, 6),           # not ptrace: allow
        _insn(LD_W_ABS, OFF_ARG0),
        _insn(JEQ_K, PTRACE_GETREGSET, 1, 0),
        _insn(JEQ_K, PTRACE_SETREGSET, 0, 3),    # another request: allow
        _insn(LD_W_ABS, OFF_ARG2),
        _insn(JEQ_K, NT_X86_XSTATE, 0, 1),       # another regset: allow
        _insn(RET_K, RET_ERRNO | EIO),
        _insn(RET_K, RET_ALLOW),
    ])


def install_filter() -> None:
    """Install the filter on this process (inherited across fork and exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = ctypes.create_string_buffer(filter_program())
    count = len(program.raw) // 8

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(count, ctypes.cast(program, ctypes.c_void_p))
    for args in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
                 (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)):
        if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl{args[:2]}: {os.strerror(err)}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: launcher.py UML-BINARY [ARGS...]")
    install_filter()
    os.execv(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv)
