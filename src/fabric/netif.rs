//! Host network interfaces: enumeration and `NCCL_SOCKET_IFNAME`-style selection.
