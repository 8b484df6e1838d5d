/* preflight.h - the checks `serve` (and the commands that run a model) make before loading
 * weights, so a busy port or a machine without an NVIDIA driver is reported in seconds, in plain
 * words, instead of after minutes of loading. */
#ifndef MS_TOOLS_PREFLIGHT_H
#define MS_TOOLS_PREFLIGHT_H

/* --device DEVICE (cpu|cuda) with --device-index index can run here: CUDA compiled in, a driver
 * loaded, a GPU of that index visible. Returns 0, or -1 after one line "moeserve CMD: flag --device
 * cuda: ..." on stderr. */
int ms_preflight_device(const char *cmd, const char *device, int index);

/* host:port can be listened on now (bound, then released; port 0 always can). Returns 0, or -1
 * after one line naming --host/--port and the cause (in use, permission, unknown address). */
int ms_preflight_port(const char *cmd, const char *host, int port);

#endif
