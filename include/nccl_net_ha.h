/*
 * nccl_net_ha.h — the NCCL ext-net ABI as implemented by nccl-net-ha (libnccl-net-ha.so).
 *
 * This is the project's own declaration of the types and entry-point tables that NCCL
 * expects from a network plugin. It is written from the documented ABI (type sizes, member
 * order, constant values) and is checked against the Rust mirrors in crates/nccl-net-abi/ by
 * crates/nccl-net-abi/tests/c_layout.rs: every size and field offset declared here must match the Rust side.
 *
 * Layout of this header:
 *   1. Definitions shared by every ABI version (result codes, logging, constants).
 *   2. One section per ext-net version the plugin exports: v8, v9, v10, v11, v12. NCCL uses
 *      the newest table it finds (`dlsym` of ncclNetPlugin_v12, then _v11, _v10, _v9, _v8);
 *      a build with HA_ABI_MAX=N (scripts/build.sh) exports only v8..vN.
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

/* Physical devices one virtual NIC may fuse (v9+ vProps). */
#define NCCL_NET_MAX_DEVS_PER_NIC 4

/* ncclNetCommConfig_v10/v11_t::trafficClass when the application set none. */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF -1

/* An unset field of ncclNetAttr_v11_t. */
#define NCCL_NET_ATTR_UNDEF -1

/* NCCL's profiler callback, handed to init() from v10 on. The plugin stores it and defines
 * no events of its own. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

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

/* ==========================================================================================
 * 3. ext-net v9 (NCCL 2.24+): size_t sizes, forceFlush, virtual NICs, transfer size limits
 * ========================================================================================== */

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;

/* The physical devices a virtual NIC fuses. 20 bytes. */
typedef struct {
  int ndevs;                           /*  0 */
  int devs[NCCL_NET_MAX_DEVS_PER_NIC]; /*  4 */
} ncclNetVDeviceProps_v9_t;

/* 104 bytes, 8-byte aligned. */
typedef struct {
  char* name;             /*   0 */
  char* pciPath;          /*   8 */
  uint64_t guid;          /*  16 */
  int ptrSupport;         /*  24 */
  int regIsGlobal;        /*  28 */
  int forceFlush;         /*  32: 1 = NCCL must flush every receive (0 here: host memory) */
  int speed;              /*  36 */
  int port;               /*  40 */
  float latency;          /*  44 */
  int maxComms;           /*  48 */
  int maxRecvs;           /*  52 */
  ncclNetDeviceType netDeviceType; /* 56 */
  int netDeviceVersion;   /*  60 */
  ncclNetVDeviceProps_v9_t vProps; /* 64: this plugin: {1, {dev}} */
  size_t maxP2pBytes;     /*  88: largest isend NCCL issues (this plugin: 1 GiB) */
  size_t maxCollBytes;    /*  96: largest collective-offload transfer (this plugin: 512 MiB) */
} ncclNetProperties_v9_t;

/* The v9 plugin table: v8's entry points with size_t sizes, plus makeVDevice. 160 bytes. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  /* NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION (LL/LL128); the plugin
   * always overwrites it with a real request (or NULL = try later). */
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  /* Fuse physical devices into a virtual NIC (NULL in this plugin). */
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

extern const ncclNet_v9_t ncclNetPlugin_v9;

/* ==========================================================================================
 * 4. ext-net v10 (NCCL 2.26+): profiler callback, per-communicator config in connect()
 * ========================================================================================== */

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

/* The communicator's network configuration. 4 bytes. */
typedef struct {
  int trafficClass; /* 0: NCCL_NET_TRAFFIC_CLASS_UNDEF or 0..255 (verbs: GRH traffic class,
                       unless NCCL_IB_TC is set; sock: IP_TOS / IPV6_TCLASS) */
} ncclNetCommConfig_v10_t;

/* 160 bytes. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle,
                          void** sendComm, ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

extern const ncclNet_v10_t ncclNetPlugin_v10;

/* ==========================================================================================
 * 5. ext-net v11 (NCCL 2.28+): per-communicator contexts, finalize, setNetAttr
 * ========================================================================================== */

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

/* 112 bytes, 8-byte aligned: v9's properties plus maxMultiRequestSize. */
typedef struct {
  char* name;             /*   0 */
  char* pciPath;          /*   8 */
  uint64_t guid;          /*  16 */
  int ptrSupport;         /*  24 */
  int regIsGlobal;        /*  28 */
  int forceFlush;         /*  32 */
  int speed;              /*  36 */
  int port;               /*  40 */
  float latency;          /*  44 */
  int maxComms;           /*  48 */
  int maxRecvs;           /*  52 */
  ncclNetDeviceType netDeviceType; /* 56 */
  int netDeviceVersion;   /*  60 */
  ncclNetVDeviceProps_v11_t vProps; /* 64 */
  size_t maxP2pBytes;     /*  88 */
  size_t maxCollBytes;    /*  96 */
  int maxMultiRequestSize; /* 104: requests one multi-request may hold (this plugin: 1) */
} ncclNetProperties_v11_t;

/* 16 bytes. */
typedef struct {
  int32_t maxConcurrentPeers; /*  0 */
  int32_t minConcurrentPeers; /*  4 */
  int32_t maxFlowsPerPeer;    /*  8 */
  int32_t minFlowsPerPeer;    /* 12 */
} ncclNetCommAttr_v11_t;

/* NCCL's hints about the coming traffic (setNetAttr). 44 bytes. */
typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr; /*  0 */
  ncclNetCommAttr_v11_t recvCommAttr; /* 16 */
  uint32_t op;                        /* 32 */
  uint32_t algo;                      /* 36 */
  uint32_t proto;                     /* 40 */
} ncclNetAttr_v11_t;

/* 176 bytes. init() is called once per communicator and returns a context that listen() and
 * connect() take; finalize(ctx) ends it (closing what it still owns; the plugin's engine is
 * process-wide and stays); finalize(NULL) is a no-op. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v11_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

extern const ncclNet_v11_t ncclNetPlugin_v11;

/* ==========================================================================================
 * 6. ext-net v12 (NCCL 2.30+): 8 devices per virtual NIC, railId and planeId
 * ========================================================================================== */

/* Physical devices one virtual NIC may fuse from v12 on. */
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

/* railId / planeId of a device whose rail or plane is not known. */
#define NCCL_NET_ID_UNDEF -1

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v12_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

/* 36 bytes. */
typedef struct {
  int ndevs;                                /* 0 */
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];  /* 4 */
} ncclNetVDeviceProps_v12_t;

/* 128 bytes, 8-byte aligned: v11's properties with the 36-byte vProps, then railId and
 * planeId (this plugin: NCCL_NET_ID_UNDEF, so NCCL pairs NICs as it does for older ABIs). */
typedef struct {
  char* name;             /*   0 */
  char* pciPath;          /*   8 */
  uint64_t guid;          /*  16 */
  int ptrSupport;         /*  24 */
  int regIsGlobal;        /*  28 */
  int forceFlush;         /*  32 */
  int speed;              /*  36 */
  int port;               /*  40 */
  float latency;          /*  44 */
  int maxComms;           /*  48 */
  int maxRecvs;           /*  52 */
  ncclNetDeviceType netDeviceType; /* 56 */
  int netDeviceVersion;   /*  60 */
  ncclNetVDeviceProps_v12_t vProps; /* 64 (4 bytes of padding follow, at 100) */
  size_t maxP2pBytes;     /* 104 */
  size_t maxCollBytes;    /* 112 */
  int maxMultiRequestSize; /* 120 */
  int16_t railId;         /* 124 */
  int16_t planeId;        /* 126 */
} ncclNetProperties_v12_t;

/* 176 bytes: v11's members, order and signatures, with the v12 properties. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

extern const ncclNet_v12_t ncclNetPlugin_v12;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_NET_HA_H */
