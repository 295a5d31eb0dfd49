/*
 * nccl_net_ha.h — the NCCL ext-net ABI as implemented by nccl-net-ha (libnccl-net-ha.so).
 *
 * This is the project's own declaration of the types and entry-point tables that NCCL
 * expects from a network plugin. It is written from the documented ABI (type sizes, member
 * order, constant values) and is checked against the Rust mirrors in src/abi/ by
 * tests/c_layout.rs: every size and field offset declared here must match the Rust side.
 *
 * Layout of this header:
 *   1. Definitions shared by every ABI version (result codes, logging, constants).
 *   2. One section per ext-net version the plugin exports (currently v8).
 *
 * All structures assume an LP64 platform (x86-64 / aarch64 Linux): pointers and size_t are
 * 8 bytes, int is 4 bytes, C enums are 4 bytes.
 */
#ifndef NCCL_NET_HA_H
#define NCCL_NET_HA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================================
 * 1. Common definitions (all versions)
 * ========================================================================================== */

/* Result of every plugin entry point. A plugin never returns ncclInProgress (7). */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;

/* Severity passed to NCCL's logger; NCCL filters on it according to NCCL_DEBUG. */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem bits passed to NCCL's logger; NCCL filters on them according to NCCL_DEBUG_SUBSYS. */
typedef enum {
  NCCL_INIT = 0x1,
  NCCL_COLL = 0x2,
  NCCL_P2P = 0x4,
  NCCL_SHM = 0x8,
  NCCL_NET = 0x10,
  NCCL_GRAPH = 0x20,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALLOC = 0x100,
  NCCL_CALL = 0x200,
  NCCL_PROXY = 0x400,
  NCCL_NVLS = 0x800,
  NCCL_BOOTSTRAP = 0x1000,
  NCCL_REG = 0x2000,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

/* NCCL's logger, handed to the plugin's init(): printf-style and variadic. The plugin always
 * calls it with the format "%s" and one pre-formatted, NUL-terminated message. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

/* Size of the opaque connection handle listen() fills and connect() consumes. NCCL allocates
 * the buffer and ships it to the peer through its own bootstrap network. */
#define NCCL_NET_HANDLE_MAXSIZE 128

/* Memory kinds, as bits of ncclNetProperties_*::ptrSupport and as regMr()'s `type`. */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

/* Number of requests that may be in flight on one comm at the same time. */
#define NCCL_NET_MAX_REQUESTS 32

/* Passed in *request to irecv() when NCCL does not need the receive's completion (v9+). */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1

/* Where a device-side network handle runs; a host-only plugin reports NCCL_NET_DEVICE_HOST. */
typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

/* ==========================================================================================
 * 2. ext-net v8
 * ========================================================================================== */

/* What getProperties() reports for one device. 64 bytes, 8-byte aligned. */
typedef struct {
  char* name;             /*  0: shown in NCCL's logs only */
  char* pciPath;          /*  8: realpath of the device's PCI node; NULL for a virtual NIC */
  uint64_t guid;          /* 16: devices with equal guid are one port to the fabric */
  int ptrSupport;         /* 24: NCCL_PTR_HOST [| NCCL_PTR_CUDA] [| NCCL_PTR_DMABUF] */
  int regIsGlobal;        /* 28: 1 = registrations are not tied to the comm they were made on */
  int speed;              /* 32: link speed in Mbps */
  int port;               /* 36: port number */
  float latency;          /* 40: network latency in microseconds */
  int maxComms;           /* 44: most comms this device can carry */
  int maxRecvs;           /* 48: most buffers one grouped irecv() may take */
  ncclNetDeviceType netDeviceType; /* 52: NCCL_NET_DEVICE_HOST for this plugin */
  int netDeviceVersion;   /* 56: NCCL_NET_DEVICE_INVALID_VERSION for a host plugin */
} ncclNetProperties_v8_t;

/* Device-side handle of a comm (unused by host-only plugins). 32 bytes. */
typedef struct {
  ncclNetDeviceType netDeviceType; /*  0 */
  int netDeviceVersion;            /*  4 */
  void* handle;                    /*  8 */
  size_t size;                     /* 16 */
  int needsProxyProgress;          /* 24 */
} ncclNetDeviceHandle_v8_t;

/* The v8 plugin table: a name and 18 entry points, in this exact order. 152 bytes.
 * Entry points never block: connect()/accept() return ncclSuccess with a NULL comm until the
 * connection is established, isend()/irecv() return a NULL request when they cannot post yet. */
typedef struct {
  /* Plugin name, shown in NCCL's logs ("HA"). */
  const char* name;
  /* Initialize; on failure NCCL falls back to its internal transports. */
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  /* Number of usable devices (never 0 after a successful init). */
  ncclResult_t (*devices)(int* ndev);
  /* Properties of device `dev`. */
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  /* Create a listening endpoint on `dev`; fills `handle` (NCCL_NET_HANDLE_MAXSIZE bytes). */
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  /* Connect to the peer described by `handle`; *sendComm stays NULL until established. */
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  /* Accept a connection on `listenComm`; *recvComm stays NULL until established. */
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v8_t** recvDevComm);
  /* Register `size` bytes at `data` (`type` is an NCCL_PTR_* value) on a send or recv comm. */
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  /* Register a DMA-BUF backed region (`fd` at `offset`). */
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  /* Release a registration. */
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  /* Post a send; *request == NULL means "try again later". */
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  /* Post a grouped receive of `n` buffers; *request == NULL means "try again later". */
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                        void** mhandles, void** request);
  /* Make received data visible to the GPU (after a receive into CUDA memory). */
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  /* Poll a request; once *done == 1, `sizes` holds the byte counts and the request is gone. */
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  /* Close a send comm. */
  ncclResult_t (*closeSend)(void* sendComm);
  /* Close a recv comm. */
  ncclResult_t (*closeRecv)(void* recvComm);
  /* Close a listening endpoint. */
  ncclResult_t (*closeListen)(void* listenComm);
  /* Device pointer of a registration (NULL for host-only plugins). */
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  /* Tell the plugin a device-side receive was consumed (may be NULL). */
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

/* The v8 table exported by libnccl-net-ha.so. */
extern const ncclNet_v8_t ncclNetPlugin_v8;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_NET_HA_H */
