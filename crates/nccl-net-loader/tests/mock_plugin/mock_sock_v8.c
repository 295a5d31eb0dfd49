/*
 * mock_sock_v8.c: a small ext-net v8 plugin ("MOCKSOCK") over loopback TCP, so that
 * ha-harness can be tested across processes (--mode procs). One TCP connection per
 * send/recv comm pair:
 *  - irecv queues the request and writes a clear-to-send record {n, sizes[8], tags[8]};
 *  - the send comm's reader thread collects those records; isend returns a NULL request
 *    until one is there, matches its tag in the first record, and queues the data for the
 *    send comm's writer thread ({slot, size} header, then the bytes);
 *  - the recv comm's reader thread writes the bytes straight into the posted buffer.
 * Receives complete in posting order and sends are matched in posting order, as the v8
 * contract requires. Buffers must lie inside their registration (on the same comm).
 * Fault (environment, read by init): MOCK_CORRUPT_AT=k flips one byte of the k-th (or next)
 * non-empty message this process receives.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_v8.h"

#define MAX_RECVS 8
#define CTS_RING 64
#define HANDLE_MAGIC 0x4d4f434b534f434bULL

#define WARN(fmt, ...) fprintf(stderr, "MOCKSOCK: " fmt "\n", ##__VA_ARGS__)

enum { M_LISTEN = 0x4c4c4c4c, M_SEND = 0x53535353, M_RECV = 0x52525252, M_MR = 0x4d4d4d4d,
       M_SREQ = 0x51515151, M_RREQ = 0x52515151, M_DEAD = 0x44454144 };

struct handle { uint64_t magic; uint16_t port; };
struct cts { int32_t n; int32_t sizes[MAX_RECVS]; int32_t tags[MAX_RECVS]; };
struct hdr { int32_t slot; int32_t size; };
struct mr { int magic; void* comm; char* addr; size_t len; };
struct lcomm { int magic; int fd; };

struct sreq { int magic; int done; int size; int slot; char* data; struct sreq* next; struct scomm* s; };
struct scomm {
  int magic; int fd; int err; int closing; int inflight;
  pthread_mutex_t mu; pthread_cond_t cv;
  struct cts ring[CTS_RING]; int matched[CTS_RING][MAX_RECVS]; unsigned head, tail;
  struct sreq *wq_head, *wq_tail;
  pthread_t reader, writer;
};

struct slot { char* data; int size; int tag; int recvd; };
struct rreq { int magic; int done; int n; int nrecv; struct slot slot[MAX_RECVS]; struct rreq* next; struct rcomm* r; };
struct rcomm {
  int magic; int fd; int err; int inflight;
  pthread_mutex_t mu;
  struct rreq *head, *tail;
  pthread_t reader;
};

static char dev_name[] = "lo";
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static long corrupt_at, received;

static int read_all(int fd, void* p, size_t n) {
  char* c = p;
  while (n > 0) {
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k; n -= (size_t)k;
  }
  return 0;
}

static int write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k; n -= (size_t)k;
  }
  return 0;
}

static ncclResult_t m_init(ncclDebugLogger_t log) {
  (void)log;
  const char* v = getenv("MOCK_CORRUPT_AT");
  pthread_mutex_lock(&fault_mu);
  corrupt_at = v ? atol(v) : 0;
  pthread_mutex_unlock(&fault_mu);
  return ncclSuccess;
}
static ncclResult_t m_devices(int* n) { *n = 1; return ncclSuccess; }

static ncclResult_t m_props(int dev, ncclNetProperties_v8_t* p) {
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof(*p));
  p->name = dev_name; p->guid = 0x50c; p->ptrSupport = NCCL_PTR_HOST; p->speed = 10000;
  p->port = 1; p->maxComms = 1024; p->maxRecvs = MAX_RECVS;
  return ncclSuccess;
}

static ncclResult_t m_listen(int dev, void* h, void** out) {
  if (dev != 0) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a; memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) || listen(fd, 16) ||
      getsockname(fd, (struct sockaddr*)&a, &len) || fcntl(fd, F_SETFL, O_NONBLOCK)) {
    WARN("listen: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  struct handle hd = { HANDLE_MAGIC, ntohs(a.sin_port) };
  memset(h, 0, 128);
  memcpy(h, &hd, sizeof(hd));
  struct lcomm* l = calloc(1, sizeof(*l));
  l->magic = M_LISTEN; l->fd = fd;
  *out = l;
  return ncclSuccess;
}

static void* s_reader(void* arg) {
  struct scomm* s = arg;
  struct cts c;
  while (read_all(s->fd, &c, sizeof(c)) == 0) {
    pthread_mutex_lock(&s->mu);
    if (s->tail - s->head == CTS_RING) { WARN("CTS ring overflow"); s->err = 1; pthread_mutex_unlock(&s->mu); break; }
    s->ring[s->tail % CTS_RING] = c;
    memset(s->matched[s->tail % CTS_RING], 0, sizeof(s->matched[0]));
    s->tail++;
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

static void* s_writer(void* arg) {
  struct scomm* s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->wq_head && !s->closing) pthread_cond_wait(&s->cv, &s->mu);
    struct sreq* q = s->wq_head;
    if (!q) break;
    s->wq_head = q->next;
    if (!s->wq_head) s->wq_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    struct hdr h = { q->slot, q->size };
    int bad = write_all(s->fd, &h, sizeof(h)) || write_all(s->fd, q->data, (size_t)q->size);
    pthread_mutex_lock(&s->mu);
    if (bad) s->err = 1;
    q->done = 1;
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void* r_reader(void* arg) {
  struct rcomm* r = arg;
  struct hdr h;
  while (read_all(r->fd, &h, sizeof(h)) == 0) {
    pthread_mutex_lock(&r->mu);
    struct rreq* q = r->head;
    pthread_mutex_unlock(&r->mu);
    if (!q || h.slot < 0 || h.slot >= q->n || h.size > q->slot[h.slot].size || h.size < 0) {
      WARN("unexpected data (slot %d, %d bytes)", h.slot, h.size);
      pthread_mutex_lock(&r->mu); r->err = 1; pthread_mutex_unlock(&r->mu);
      break;
    }
    if (read_all(r->fd, q->slot[h.slot].data, (size_t)h.size)) break;
    pthread_mutex_lock(&fault_mu);
    received++;
    if (corrupt_at > 0 && h.size > 0 && received >= corrupt_at) {
      q->slot[h.slot].data[h.size / 2] ^= 0x20;
      corrupt_at = 0;
    }
    pthread_mutex_unlock(&fault_mu);
    pthread_mutex_lock(&r->mu);
    q->slot[h.slot].recvd = h.size;
    if (++q->nrecv == q->n) {
      q->done = 1;
      r->head = q->next;
      if (!r->head) r->tail = NULL;
    }
    pthread_mutex_unlock(&r->mu);
  }
  return NULL;
}

static void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static ncclResult_t m_connect(int dev, void* h, void** out, ncclNetDeviceHandle_v8_t** dc) {
  (void)dev; (void)dc;
  struct handle hd;
  memcpy(&hd, h, sizeof(hd));
  *out = NULL;
  if (hd.magic != HANDLE_MAGIC) { WARN("connect: bad handle"); return ncclInvalidArgument; }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a; memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); a.sin_port = htons(hd.port);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof(a))) {
    WARN("connect: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  nodelay(fd);
  struct scomm* s = calloc(1, sizeof(*s));
  s->magic = M_SEND; s->fd = fd;
  pthread_mutex_init(&s->mu, NULL); pthread_cond_init(&s->cv, NULL);
  pthread_create(&s->reader, NULL, s_reader, s);
  pthread_create(&s->writer, NULL, s_writer, s);
  *out = s;
  return ncclSuccess;
}

static ncclResult_t m_accept(void* lc, void** out, ncclNetDeviceHandle_v8_t** dc) {
  (void)dc;
  struct lcomm* l = lc;
  *out = NULL;
  if (!l || l->magic != M_LISTEN) return ncclInvalidArgument;
  int fd = accept(l->fd, NULL, NULL);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess;
    WARN("accept: %s", strerror(errno));
    return ncclSystemError;
  }
  fcntl(fd, F_SETFL, 0);
  nodelay(fd);
  struct rcomm* r = calloc(1, sizeof(*r));
  r->magic = M_RECV; r->fd = fd;
  pthread_mutex_init(&r->mu, NULL);
  pthread_create(&r->reader, NULL, r_reader, r);
  *out = r;
  return ncclSuccess;
}

static int is_comm(void* c) {
  int m = c ? *(int*)c : 0;
  return m == M_SEND || m == M_RECV;
}

static ncclResult_t m_regmr(void* comm, void* data, size_t size, int type, void** mh) {
  if (!is_comm(comm)) return ncclInvalidArgument;
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
  if (!m || m->magic != M_MR || m->comm != comm) return ncclInvalidArgument;
  m->magic = M_DEAD;
  free(m);
  return ncclSuccess;
}

static int in_mr(void* comm, struct mr* m, void* data, int size) {
  if (!m || m->magic != M_MR || m->comm != comm || size < 0) return 0;
  char* p = data;
  return p >= m->addr && p + size <= m->addr + m->len;
}

static ncclResult_t m_isend(void* sc, void* data, int size, int tag, void* mh, void** request) {
  struct scomm* s = sc;
  *request = NULL;
  if (!s || s->magic != M_SEND) return ncclInvalidArgument;
  if (!in_mr(sc, mh, data, size)) { WARN("isend: buffer not inside its registration"); return ncclInvalidArgument; }
  ncclResult_t rc = ncclSuccess;
  pthread_mutex_lock(&s->mu);
  if (s->err) { rc = ncclSystemError; goto out; }
  if (s->inflight >= MAX_REQUESTS) { WARN("isend: too many requests"); rc = ncclInvalidUsage; goto out; }
  if (s->head == s->tail) goto out;  /* no receive posted yet */
  struct cts* c = &s->ring[s->head % CTS_RING];
  int* matched = s->matched[s->head % CTS_RING];
  int j;
  for (j = 0; j < c->n; j++) if (!matched[j] && c->tags[j] == tag) break;
  if (j == c->n) { WARN("isend: no receive slot with tag %d", tag); rc = ncclInternalError; goto out; }
  if (size > c->sizes[j]) { WARN("isend: %d bytes into %d", size, c->sizes[j]); rc = ncclInvalidUsage; goto out; }
  matched[j] = 1;
  int all = 1;
  for (int i = 0; i < c->n; i++) all &= matched[i];
  if (all) s->head++;
  struct sreq* q = calloc(1, sizeof(*q));
  q->magic = M_SREQ; q->size = size; q->slot = j; q->data = data; q->s = s;
  if (s->wq_tail) s->wq_tail->next = q; else s->wq_head = q;
  s->wq_tail = q;
  s->inflight++;
  pthread_cond_signal(&s->cv);
  *request = q;
out:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static ncclResult_t m_irecv(void* rc_, int n, void** data, int* sizes, int* tags, void** mh, void** request) {
  struct rcomm* r = rc_;
  *request = NULL;
  if (!r || r->magic != M_RECV) return ncclInvalidArgument;
  if (n < 1 || n > MAX_RECVS) return ncclInvalidArgument;
  for (int i = 0; i < n; i++)
    if (!in_mr(r, mh[i], data[i], sizes[i])) { WARN("irecv: buffer %d not inside its registration", i); return ncclInvalidArgument; }
  pthread_mutex_lock(&r->mu);
  if (r->err) { pthread_mutex_unlock(&r->mu); return ncclSystemError; }
  if (r->inflight >= MAX_REQUESTS) { pthread_mutex_unlock(&r->mu); WARN("irecv: too many requests"); return ncclInvalidUsage; }
  struct rreq* q = calloc(1, sizeof(*q));
  q->magic = M_RREQ; q->n = n; q->r = r;
  struct cts c; memset(&c, 0, sizeof(c));
  c.n = n;
  for (int i = 0; i < n; i++) {
    q->slot[i].data = data[i]; q->slot[i].size = sizes[i]; q->slot[i].tag = tags[i];
    c.sizes[i] = sizes[i]; c.tags[i] = tags[i];
  }
  if (r->tail) r->tail->next = q; else r->head = q;
  r->tail = q;
  r->inflight++;
  /* Only this thread writes on a recv comm's socket; the peer's reader always drains it. */
  int bad = write_all(r->fd, &c, sizeof(c));
  if (bad) r->err = 1;
  pthread_mutex_unlock(&r->mu);
  if (bad) return ncclSystemError;
  *request = q;
  return ncclSuccess;
}

static ncclResult_t m_iflush(void* c, int n, void** d, int* s, void** mh, void** request) {
  (void)c; (void)n; (void)d; (void)s; (void)mh;
  *request = NULL;
  return ncclSuccess;
}

static ncclResult_t m_test(void* request, int* done, int* sizes) {
  int magic = request ? *(int*)request : 0;
  *done = 0;
  if (magic == M_SREQ) {
    struct sreq* q = request;
    struct scomm* s = q->s;
    pthread_mutex_lock(&s->mu);
    int err = s->err;
    if (q->done) {
      *done = 1;
      if (sizes) sizes[0] = q->size;
      s->inflight--;
      q->magic = M_DEAD;
      free(q);
    }
    pthread_mutex_unlock(&s->mu);
    return err ? ncclSystemError : ncclSuccess;
  }
  if (magic == M_RREQ) {
    struct rreq* q = request;
    struct rcomm* r = q->r;
    pthread_mutex_lock(&r->mu);
    int err = r->err;
    if (q->done) {
      *done = 1;
      if (sizes) for (int i = 0; i < q->n; i++) sizes[i] = q->slot[i].recvd;
      r->inflight--;
      q->magic = M_DEAD;
      free(q);
    }
    pthread_mutex_unlock(&r->mu);
    return err ? ncclSystemError : ncclSuccess;
  }
  WARN("test: bad request");
  return ncclInvalidArgument;
}

static ncclResult_t m_close_send(void* c) {
  struct scomm* s = c;
  if (!s || s->magic != M_SEND) return ncclInvalidArgument;
  pthread_mutex_lock(&s->mu);
  s->closing = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->writer, NULL);  /* drains queued sends first */
  shutdown(s->fd, SHUT_RDWR);
  pthread_join(s->reader, NULL);
  close(s->fd);
  s->magic = M_DEAD;
  free(s);
  return ncclSuccess;
}

static ncclResult_t m_close_recv(void* c) {
  struct rcomm* r = c;
  if (!r || r->magic != M_RECV) return ncclInvalidArgument;
  shutdown(r->fd, SHUT_RDWR);
  pthread_join(r->reader, NULL);
  close(r->fd);
  r->magic = M_DEAD;
  free(r);
  return ncclSuccess;
}

static ncclResult_t m_close_listen(void* c) {
  struct lcomm* l = c;
  if (!l || l->magic != M_LISTEN) return ncclInvalidArgument;
  close(l->fd);
  l->magic = M_DEAD;
  free(l);
  return ncclSuccess;
}

ncclNet_v8_t ncclNetPlugin_v8 = {
  "MOCKSOCK", m_init, m_devices, m_props, m_listen, m_connect, m_accept, m_regmr,
  m_regmr_dmabuf, m_deregmr, m_isend, m_irecv, m_iflush, m_test, m_close_send, m_close_recv,
  m_close_listen, NULL, NULL
};
