/* net_v8.h: the ext-net v8 types the mock plugins need (layout as NCCL's net_v8.h). */
#ifndef MOCK_NET_V8_H
#define MOCK_NET_V8_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
  ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
  ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6
} ncclResult_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int speed;
  int port; float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} ncclNetProperties_v8_t;
typedef struct {
  int netDeviceType; int netDeviceVersion; void* handle; size_t size; int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;
typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t);
  ncclResult_t (*devices)(int*);
  ncclResult_t (*getProperties)(int, ncclNetProperties_v8_t*);
  ncclResult_t (*listen)(int, void*, void**);
  ncclResult_t (*connect)(int, void*, void**, ncclNetDeviceHandle_v8_t**);
  ncclResult_t (*accept)(void*, void**, ncclNetDeviceHandle_v8_t**);
  ncclResult_t (*regMr)(void*, void*, size_t, int, void**);
  ncclResult_t (*regMrDmaBuf)(void*, void*, size_t, int, uint64_t, int, void**);
  ncclResult_t (*deregMr)(void*, void*);
  ncclResult_t (*isend)(void*, void*, int, int, void*, void**);
  ncclResult_t (*irecv)(void*, int, void**, int*, int*, void**, void**);
  ncclResult_t (*iflush)(void*, int, void**, int*, void**, void**);
  ncclResult_t (*test)(void*, int*, int*);
  ncclResult_t (*closeSend)(void*);
  ncclResult_t (*closeRecv)(void*);
  ncclResult_t (*closeListen)(void*);
  ncclResult_t (*getDeviceMr)(void*, void*, void**);
  ncclResult_t (*irecvConsumed)(void*, int, void*);
} ncclNet_v8_t;

#define NCCL_PTR_HOST 1
#define MAX_REQUESTS 32

#endif
