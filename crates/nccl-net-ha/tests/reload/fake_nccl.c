/* A stand-in for libnccl.so, built by tests/abi_reload.rs: the parts of NCCL 2.28-2.30 that a
 * net plugin sees across communicator re-creation.
 *  - ncclGetVersion() (exported), with the version the test sets;
 *  - a hidden variadic logger (NCCL's ncclDebugLog) that records every line;
 *  - one external plugin slot run as src/plugin/net.cc does: the first comm opens the
 *    library by name (plugin_open.cc: the name, then "libnccl-net-<name>.so"; an empty name
 *    means "libnccl-net.so"), every comm takes a reference, the last release dlcloses it and,
 *    unless `fixed` (2.30), wipes the name (2.28/2.29's memset).
 * The library is linked with a RUNPATH, so its dlopen searches that folder the way a real
 * libnccl's does. Thread-safe: the plugin logs from its own threads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int version;
/* The plugin's WARN lines and its "loaded by" INFO line (everything else is dropped). */
static char lines[256][1024];
static int nlines;

int ncclGetVersion(int* v) {
  if (!v) return 4;
  *v = version;
  return 0;
}

__attribute__((visibility("hidden"))) void fake_debug_log(int level, unsigned long flags,
                                                          const char* file, int line,
                                                          const char* fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  (void)flags; (void)file; (void)line;
  if (level != 2 && !strstr(msg, "loaded by")) return;
  pthread_mutex_lock(&mu);
  if (nlines < 256) {
    snprintf(lines[nlines], sizeof lines[0], "%s %s",
             level == 2 ? "WARN" : level == 3 ? "INFO" : "OTHER", msg);
    nlines++;
  }
  pthread_mutex_unlock(&mu);
}

void* fake_logger(void) { return (void*)fake_debug_log; }
void fake_set_version(int v) { version = v; }
int fake_lines(void) {
  pthread_mutex_lock(&mu);
  int n = nlines;
  pthread_mutex_unlock(&mu);
  return n;
}
/* Copy line i into out (len bytes); returns 0, or -1 if there is no such line. */
int fake_line(int i, char* out, int len) {
  int rc = -1;
  pthread_mutex_lock(&mu);
  if (i >= 0 && i < nlines) { snprintf(out, len, "%s", lines[i]); rc = 0; }
  pthread_mutex_unlock(&mu);
  return rc;
}

static char slot_name[255];
static void* slot_handle;
static int slot_refs, slot_fixed;
static char opened[512], error[512];

/* A fresh slot (what NCCL's initPluginLibsOnceFunc sets up). Closes what an earlier slot
 * left open. */
void fake_slot_setup(const char* name, int initial_refs, int fixed) {
  if (slot_handle) dlclose(slot_handle);
  slot_handle = NULL;
  snprintf(slot_name, sizeof slot_name, "%s", name);
  slot_refs = initial_refs;
  slot_fixed = fixed;
}

static void* try_open(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h) snprintf(opened, sizeof opened, "%s", name);
  else snprintf(error, sizeof error, "%s", dlerror());
  return h;
}

/* One communicator's reference: opens the library when none is loaded. NULL on failure
 * (fake_error() says why). */
void* fake_slot_acquire(void) {
  if (!slot_handle) {
    const char* name = slot_name[0] ? slot_name : "libnccl-net.so";
    void* h = try_open(name);
    size_t n = strlen(name);
    int lib_so = strncmp(name, "lib", 3) == 0 && n > 3 && strcmp(name + n - 3, ".so") == 0;
    if (!h && slot_name[0] && !strchr(name, '/') && !lib_so) {
      char alt[300];
      snprintf(alt, sizeof alt, "libnccl-net-%s.so", name);
      h = try_open(alt);
    }
    if (!h) return NULL;
    slot_handle = h;
  }
  slot_refs++;
  return slot_handle;
}

/* A communicator's release: 1 when it closed the library. */
int fake_slot_release(void) {
  if (--slot_refs > 0 || !slot_handle) return 0;
  dlclose(slot_handle);
  slot_handle = NULL;
  if (!slot_fixed) memset(slot_name, 0, sizeof slot_name);
  return 1;
}

const char* fake_opened(void) { return opened; }
const char* fake_error(void) { return error; }
