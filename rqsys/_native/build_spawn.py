"""cffi (API mode) build script for the spawn helper; see spawn.c."""

from pathlib import Path

from cffi import FFI

ffibuilder = FFI()
ffibuilder.cdef(
    """
    int rq_start(const char *path, char *const argv[], char *const envp[],
                 const char *cwd, int out, int parent, int fds[5]);
    int rq_start_as(const char *path, char *const argv[], char *const envp[],
                    const char *cwd, int out, int parent, int fds[5], long long as_limit);
    int rq_start_user(const char *path, char *const argv[], char *const envp[],
                      const char *cwd, int out, int parent, int fds[5], long long as_limit,
                      unsigned int uid, unsigned int gid, int ngroups,
                      const unsigned int *groups);
    int syncfs(int fd);
    int rq_set_pdeathsig(int sig);
    void rq_reset_signals(unsigned long long mask);
    """
)
ffibuilder.set_source(
    "rqsys._native._rqspawn",
    (Path(__file__).parent / "spawn.c").read_text(),
    extra_compile_args=["-O2", "-Wall"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
