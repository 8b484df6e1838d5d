/* preflight.c - see preflight.h. */
#include "common/preflight.h"

#include "backend/backend.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int ms_preflight_device(const char *cmd, const char *device, int index) {
    if (!device || strcmp(device, "cuda")) return 0;
    if (!ms_backend_cuda_compiled()) {
        fprintf(stderr, "moeserve %s: flag --device cuda: this moeserve was built without CUDA (no nvcc at build time, "
                        "or CUDA=0); rebuild it where the CUDA toolkit is installed, or run with --device cpu\n", cmd);
        return -1;
    }
#ifdef MS_HAVE_CUDA
    int drv = 0, rt = 0;
    ms_cuda_versions(&drv, &rt);
    if (!drv) {
        fprintf(stderr, "moeserve %s: flag --device cuda: no NVIDIA driver is loaded on this machine (nvidia-smi should "
                        "list the GPUs once it is); install the driver, or run with --device cpu\n", cmd);
        return -1;
    }
    int n = ms_cuda_device_count();
    if (n <= 0) {
        fprintf(stderr, "moeserve %s: flag --device cuda: the NVIDIA driver (%d.%d) sees no GPU (check nvidia-smi and "
                        "CUDA_VISIBLE_DEVICES), or run with --device cpu\n", cmd, drv / 1000, (drv % 1000) / 10);
        return -1;
    }
    if (index < 0 || index >= n) {
        fprintf(stderr, "moeserve %s: flag --device-index %d: this machine has %d visible GPU%s (0..%d)\n", cmd, index, n,
                n == 1 ? "" : "s", n - 1);
        return -1;
    }
#else
    (void)index;
#endif
    return 0;
}

int ms_preflight_port(const char *cmd, const char *host, int port) {
    if (port == 0) return 0;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        fprintf(stderr, "moeserve %s: flag --host: cannot use '%s' as a listen address: %s\n", cmd, host, gai_strerror(g));
        return -1;
    }
    int rc = 0, e = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1) != 0) e = errno, rc = -1;
        close(fd);
        break;
    }
    freeaddrinfo(res);
    if (rc) {
        if (e == EADDRINUSE)
            fprintf(stderr, "moeserve %s: flag --port %d: %s:%d is already in use (another server running?); stop it, or "
                            "pick another --port (0 = any free port)\n", cmd, port, host, port);
        else if (e == EACCES)
            fprintf(stderr, "moeserve %s: flag --port %d: permission denied (ports below 1024 need privileges); pick a "
                            "port above 1023\n", cmd, port);
        else if (e == EADDRNOTAVAIL)
            fprintf(stderr, "moeserve %s: flag --host %s: not an address of this machine\n", cmd, host);
        else
            fprintf(stderr, "moeserve %s: flag --port %d: cannot listen on %s:%d: %s\n", cmd, port, host, port, strerror(e));
    }
    return rc;
}
