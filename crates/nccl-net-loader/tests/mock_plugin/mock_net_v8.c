/*
 * mock_net_v8.c: a small in-process ext-net v8 plugin ("MOCK") for testing the loader and
 * ha-harness without a network. Both endpoints must live in one process (threads mode):
 * connect() finds the listener through a process-wide table; a handle from another process
 * is rejected with ncclSystemError.
 *
 * Semantics follow the v8 contract closely enough to catch harness mistakes:
 *  - connect() always returns NULL on its first call and again until accept() took the
 *    connection; accept() returns NULL until a connect() arrived;
 *  - isend() returns a NULL request until the receiver posted an irecv; it matches its tag
 *    against the first posted (multi-)receive, copies the data, fails on an unknown tag or a
 *    message larger than the slot;
 *  - every buffer must lie inside the registration passed with it, registered on that comm;
 *  - more than 32 requests in flight on a comm is ncclInvalidUsage;
 *  - test() reports done only after MOCK_TEST_DELAY (default 2) calls.
 * Faults (environment, read by init): MOCK_NULL_EVERY=k (every k-th isend/irecv returns a
 * NULL request), MOCK_CORRUPT_AT=k (the k-th non-empty delivered message gets one byte
 * flipped), MOCK_BAD_SIZE_AT=k (the k-th delivered message reports one byte too many).
 * Build-time variants: -DMOCK_NO_ISEND (NULL isend entry), -DMOCK_MAXRECVS=n.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net_v8.h"

#ifndef MOCK_MAXRECVS
#define MOCK_MAXRECVS 8
#endif
#define MAX_LISTENS 256
#define MAX_PENDING 16

enum { M_LISTEN = 0x4c4c4c4c, M_SEND = 0x53535353, M_RECV = 0x52525252, M_MR = 0x4d4d4d4d,
       M_REQ = 0x51515151, M_DEAD = 0x44454144 };
enum { K_SEND, K_RECV };

#define WARN(fmt, ...) fprintf(stderr, "MOCK: " fmt "\n", ##__VA_ARGS__)

struct conn;
struct mr { int magic; void* comm; char* addr; size_t len; };
struct slot { char* data; int size; int tag; int matched; int recvd; };
struct req {
  int magic; int kind; int tests_left; int size; void* comm;
  int n, nmatched; struct slot slot[MOCK_MAXRECVS]; struct req* next;
};
struct conn { struct req *head, *tail; int accepted; };
struct lcomm { int magic; uint64_t id; struct conn* pending[MAX_PENDING]; int npending; };
struct scomm { int magic; struct conn* c; int inflight; };
struct rcomm { int magic; struct conn* c; int inflight; };
struct handle { uint64_t magic; uint64_t listen_id; int64_t pid; struct conn* c; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct lcomm* listens[MAX_LISTENS];
static uint64_t next_id = 1;
static long null_every, corrupt_at, bad_size_at, test_delay = 2;
static long post_calls, delivered;
static char dev_name[] = "mock0";

static long env_long(const char* k, long dflt) {
  const char* v = getenv(k);
  return v ? atol(v) : dflt;
}

static ncclResult_t m_init(ncclDebugLogger_t log) {
  (void)log;
  pthread_mutex_lock(&lock);
  null_every = env_long("MOCK_NULL_EVERY", 0);
  corrupt_at = env_long("MOCK_CORRUPT_AT", 0);
  bad_size_at = env_long("MOCK_BAD_SIZE_AT", 0);
  test_delay = env_long("MOCK_TEST_DELAY", 2);
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static ncclResult_t m_devices(int* n) { *n = 1; return ncclSuccess; }

static ncclResult_t m_props(int dev, ncclNetProperties_v8_t* p) {
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof(*p));
  p->name = dev_name; p->pciPath = NULL; p->guid = 0x1234; p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 100000; p->port = 1; p->latency = 0; p->maxComms = 1024;
  p->maxRecvs = MOCK_MAXRECVS;
  return ncclSuccess;
}

static ncclResult_t m_listen(int dev, void* h, void** out) {
  if (dev != 0) return ncclInvalidArgument;
  pthread_mutex_lock(&lock);
  int i;
  for (i = 0; i < MAX_LISTENS && listens[i]; i++) {}
  if (i == MAX_LISTENS) { pthread_mutex_unlock(&lock); return ncclSystemError; }
  struct lcomm* l = calloc(1, sizeof(*l));
  l->magic = M_LISTEN; l->id = next_id++;
  listens[i] = l;
  struct handle hd = { 0x4d4f434b484e444cULL, l->id, getpid(), NULL };
  memcpy(h, &hd, sizeof(hd));
  *out = l;
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static ncclResult_t m_connect(int dev, void* h, void** out, ncclNetDeviceHandle_v8_t** dc) {
  (void)dev; (void)dc;
  struct handle hd;
  memcpy(&hd, h, sizeof(hd));
  *out = NULL;
  if (hd.magic != 0x4d4f434b484e444cULL) { WARN("connect: bad handle"); return ncclInvalidArgument; }
  if (hd.pid != getpid()) { WARN("connect: handle from another process (pid %ld)", (long)hd.pid); return ncclSystemError; }
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&lock);
  if (hd.c == NULL) {
    struct lcomm* l = NULL;
    for (int i = 0; i < MAX_LISTENS; i++)
      if (listens[i] && listens[i]->id == hd.listen_id) l = listens[i];
    if (!l || l->npending == MAX_PENDING) { WARN("connect: no such listener"); rc = ncclSystemError; goto out; }
    hd.c = calloc(1, sizeof(struct conn));
    l->pending[l->npending++] = hd.c;
    memcpy(h, &hd, sizeof(hd));  /* NULL on the first call, always */
  } else if (hd.c->accepted) {
    struct scomm* s = calloc(1, sizeof(*s));
    s->magic = M_SEND; s->c = hd.c;
    *out = s;
  }
out:
  pthread_mutex_unlock(&lock);
  return rc;
}

static ncclResult_t m_accept(void* lc, void** out, ncclNetDeviceHandle_v8_t** dc) {
  (void)dc;
  struct lcomm* l = lc;
  *out = NULL;
  if (!l || l->magic != M_LISTEN) return ncclInvalidArgument;
  pthread_mutex_lock(&lock);
  if (l->npending > 0) {
    struct conn* c = l->pending[0];
    memmove(l->pending, l->pending + 1, sizeof(l->pending[0]) * --l->npending);
    c->accepted = 1;
    struct rcomm* r = calloc(1, sizeof(*r));
    r->magic = M_RECV; r->c = c;
    *out = r;
  }
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static int is_comm(void* c) {
  int m = c ? *(int*)c : 0;
  return m == M_SEND || m == M_RECV;
}

static ncclResult_t m_regmr(void* comm, void* data, size_t size, int type, void** mh) {
  if (!is_comm(comm)) { WARN("regMr: bad comm"); return ncclInvalidArgument; }
  if (type != NCCL_PTR_HOST) return ncclInternalError;
  struct mr* m = calloc(1, sizeof(*m));
  m->magic = M_MR; m->comm = comm; m->addr = data; m->len = size;
  *mh = m;
  return ncclSuccess;
}

static ncclResult_t m_regmr_dmabuf(void* c, void* d, size_t s, int t, uint64_t o, int fd, void** mh) {
  (void)c; (void)d; (void)s; (void)t; (void)o; (void)fd; (void)mh;
  return ncclInternalError;
}

static ncclResult_t m_deregmr(void* comm, void* mh) {
  struct mr* m = mh;
  if (!m || m->magic != M_MR || m->comm != comm) { WARN("deregMr: bad handle"); return ncclInvalidArgument; }
  m->magic = M_DEAD;
  free(m);
  return ncclSuccess;
}

static int in_mr(void* comm, struct mr* m, void* data, int size) {
  if (!m || m->magic != M_MR || m->comm != comm || size < 0) return 0;
  char* p = data;
  return p >= m->addr && p + size <= m->addr + m->len;
}

/* Called with the lock held. */
static int skip_post(void) {
  return null_every > 0 && ++post_calls % null_every == 0;
}

__attribute__((unused)) static ncclResult_t m_isend(void* sc, void* data, int size, int tag, void* mh, void** request) {
  struct scomm* s = sc;
  *request = NULL;
  if (!s || s->magic != M_SEND) { WARN("isend: bad comm"); return ncclInvalidArgument; }
  if (!in_mr(sc, mh, data, size)) { WARN("isend: buffer not inside its registration"); return ncclInvalidArgument; }
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&lock);
  if (s->inflight >= MAX_REQUESTS) { WARN("isend: more than %d requests in flight", MAX_REQUESTS); rc = ncclInvalidUsage; goto out; }
  if (skip_post()) goto out;
  struct req* r = s->c->head;
  if (!r) goto out;  /* receiver has not posted yet: try later */
  struct slot* sl = NULL;
  for (int i = 0; i < r->n; i++)
    if (!r->slot[i].matched && r->slot[i].tag == tag) { sl = &r->slot[i]; break; }
  if (!sl) { WARN("isend: no receive slot with tag %d", tag); rc = ncclInternalError; goto out; }
  if (size > sl->size) { WARN("isend: %d bytes into a %d-byte receive", size, sl->size); rc = ncclInvalidUsage; goto out; }
  memcpy(sl->data, data, size);
  sl->recvd = size;
  sl->matched = 1;
  delivered++;
  if (corrupt_at > 0 && size > 0 && delivered >= corrupt_at) { sl->data[size / 2] ^= 0x20; corrupt_at = 0; }
  if (bad_size_at > 0 && delivered == bad_size_at) sl->recvd = size + 1;
  if (++r->nmatched == r->n) {
    s->c->head = r->next;
    if (!s->c->head) s->c->tail = NULL;
  }
  struct req* q = calloc(1, sizeof(*q));
  q->magic = M_REQ; q->kind = K_SEND; q->size = size; q->comm = s; q->tests_left = test_delay - 1;
  s->inflight++;
  *request = q;
out:
  pthread_mutex_unlock(&lock);
  return rc;
}

static ncclResult_t m_irecv(void* rc_, int n, void** data, int* sizes, int* tags, void** mh, void** request) {
  struct rcomm* c = rc_;
  *request = NULL;
  if (!c || c->magic != M_RECV) { WARN("irecv: bad comm"); return ncclInvalidArgument; }
  if (n < 1 || n > MOCK_MAXRECVS) { WARN("irecv: n=%d", n); return ncclInvalidArgument; }
  for (int i = 0; i < n; i++)
    if (!in_mr(c, mh[i], data[i], sizes[i])) { WARN("irecv: buffer %d not inside its registration", i); return ncclInvalidArgument; }
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&lock);
  if (c->inflight >= MAX_REQUESTS) { WARN("irecv: more than %d requests in flight", MAX_REQUESTS); rc = ncclInvalidUsage; goto out; }
  if (skip_post()) goto out;
  struct req* q = calloc(1, sizeof(*q));
  q->magic = M_REQ; q->kind = K_RECV; q->comm = c; q->n = n; q->tests_left = test_delay - 1;
  for (int i = 0; i < n; i++) {
    q->slot[i].data = data[i]; q->slot[i].size = sizes[i]; q->slot[i].tag = tags[i];
  }
  if (c->c->tail) c->c->tail->next = q; else c->c->head = q;
  c->c->tail = q;
  c->inflight++;
  *request = q;
out:
  pthread_mutex_unlock(&lock);
  return rc;
}

static ncclResult_t m_iflush(void* c, int n, void** d, int* s, void** mh, void** request) {
  (void)c; (void)n; (void)d; (void)s; (void)mh;
  *request = NULL;  /* host memory: nothing to flush */
  return ncclSuccess;
}

static ncclResult_t m_test(void* request, int* done, int* sizes) {
  struct req* q = request;
  *done = 0;
  if (!q || q->magic != M_REQ) { WARN("test: bad request"); return ncclInvalidArgument; }
  pthread_mutex_lock(&lock);
  if (q->kind == K_RECV && q->nmatched < q->n) goto out;
  if (q->tests_left > 0) { q->tests_left--; goto out; }
  *done = 1;
  if (q->kind == K_SEND) {
    if (sizes) sizes[0] = q->size;
    ((struct scomm*)q->comm)->inflight--;
  } else {
    if (sizes) for (int i = 0; i < q->n; i++) sizes[i] = q->slot[i].recvd;
    ((struct rcomm*)q->comm)->inflight--;
  }
  q->magic = M_DEAD;
  free(q);
out:
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static ncclResult_t m_close_send(void* c) {
  struct scomm* s = c;
  if (!s || s->magic != M_SEND) return ncclInvalidArgument;
  s->magic = M_DEAD;
  free(s);
  return ncclSuccess;
}

static ncclResult_t m_close_recv(void* c) {
  struct rcomm* r = c;
  if (!r || r->magic != M_RECV) return ncclInvalidArgument;
  r->magic = M_DEAD;
  free(r);
  return ncclSuccess;
}

static ncclResult_t m_close_listen(void* c) {
  struct lcomm* l = c;
  if (!l || l->magic != M_LISTEN) return ncclInvalidArgument;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_LISTENS; i++)
    if (listens[i] == l) listens[i] = NULL;
  pthread_mutex_unlock(&lock);
  l->magic = M_DEAD;
  free(l);
  return ncclSuccess;
}

ncclNet_v8_t ncclNetPlugin_v8 = {
  "MOCK", m_init, m_devices, m_props, m_listen, m_connect, m_accept, m_regmr,
  m_regmr_dmabuf, m_deregmr,
#ifdef MOCK_NO_ISEND
  NULL,
#else
  m_isend,
#endif
  m_irecv, m_iflush, m_test, m_close_send, m_close_recv, m_close_listen, NULL, NULL
};
