/* version.h - the one version string of the binary (--version, /get_server_info, /v1/models). */
#ifndef MS_TOOLS_VERSION_H
#define MS_TOOLS_VERSION_H

#define MS_VERSION "0.1.0"

#endif
